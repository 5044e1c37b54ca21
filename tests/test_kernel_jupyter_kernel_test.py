"""The cellbox kernel passes jupyter_kernel_test's protocol checks, like any Python kernel."""

from __future__ import annotations

import unittest

import jupyter_kernel_test


class CellboxKernelTests(jupyter_kernel_test.KernelTests):
    kernel_name = "cellbox"
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    code_generate_error = "raise ValueError('cellbox test')"
    code_page_something = "print?"
    code_execute_result = [
        {"code": "1 + 2 + 3", "result": "6"},
        {"code": "[n * n for n in range(4)]", "result": "[0, 1, 4, 9]"},
        {"code": "'cell' + 'box'", "result": "'cellbox'"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>bold</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('x^2'))", "mime": "text/latex"},
    ]
    code_clear_output = "from IPython.display import clear_output; print('gone'); clear_output()"
    code_inspect_sample = "print"
    code_history_pattern = "1 + 2*"
    supported_history_operations = ("tail", "range", "search")

    complete_code_samples = ["x = 1", "print('hello')", "for i in range(3):\n    pass\n", "%time 1"]
    incomplete_code_samples = ["for i in range(3):", "def f(x):", "x = (1,"]
    invalid_code_samples = ["x = )", "1 +* 2"]
    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "import collections\ncollections.Ordered", "matches": {"OrderedDict"}},
    ]


if __name__ == "__main__":
    unittest.main()
