"""The command line: parse, call one function, render. Errors become error:/hint: lines in main.py."""
