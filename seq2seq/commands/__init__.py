"""The command line: parse, load, call a library function, print. cli.py has the parser and the
training commands, decode.py the commands that use a trained run.
"""
