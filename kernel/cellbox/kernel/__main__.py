"""``python -m cellbox.kernel -f CONNECTION_FILE``: start the kernel (the kernelspec does)."""

from cellbox.kernel.kernel import main

main()
