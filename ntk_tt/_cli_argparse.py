"""The argparse parser every ``ntk-tt`` command and ``experiments/`` script builds on
(:class:`Parser`): negative numbers as values, and a one-value option given twice refused."""

from __future__ import annotations

import argparse
import re

NEGATIVE_NUMBER = re.compile(r"^-((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|inf(inity)?)(,.*)?$", re.I)


class _Once(argparse._StoreAction):
    """A one-value option given twice is an error (argparse keeps the last silently: a fresh
    user's ``predict --lr 0.01 --lr 0.001`` ran at 0.001); list options append instead."""

    given = None

    def __call__(self, parser, namespace, values, option_string=None):
        if self.given is not None:
            parser.error(f"{option_string} is given twice ({self.given[1]} and {values}): give "
                         "it once.")
        self.given = (option_string, values)
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` that reads a negative number in any form
    (:data:`NEGATIVE_NUMBER`) as an option's value and refuses a one-value option given twice
    (:class:`_Once`); its subparsers are Parsers too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the pattern argparse itself matches arguments against to tell numbers from flags
        self._negative_number_matcher = NEGATIVE_NUMBER
        self.register("action", None, _Once)
        self.register("action", "store", _Once)

    def parse_known_args(self, args=None, namespace=None):
        for action in self._actions:  # each parse counts anew
            if isinstance(action, _Once):
                action.given = None
        return super().parse_known_args(args, namespace)


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after each option's help, except where X is None: those
    options say in their help what leaving them out means (a fresh user read "default:
    diagonal ... (default: None)" for --backbone)."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)
