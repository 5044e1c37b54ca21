"""Helpers for the browser test: a JupyterLab server (:mod:`.lab`) and a page driving it (:mod:`.notebook`)."""
