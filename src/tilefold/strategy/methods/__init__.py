"""The built-in kernel methods, one family a file."""
