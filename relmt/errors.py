"""Errors caused by the user's input (files, configs, checkpoints). The command-line entry points
print their message, which names the file, line or key, without a traceback."""


class UserError(Exception):
    """A problem with the user's input that they can fix; the message says where and how."""
