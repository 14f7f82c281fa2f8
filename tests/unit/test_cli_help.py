"""Every ``zbrl ... --help`` reads as plain text: no reStructuredText markup from docstrings."""

from __future__ import annotations

import argparse

from zbrl.cli import build_parser


def all_parsers(parser: argparse.ArgumentParser, name: str = "zbrl"):
    """``(command, parser)`` for ``parser`` and every subcommand below it."""
    yield name, parser
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from all_parsers(sub, f"{name} {sub_name}")


def test_every_help_is_plain_text():
    parsers = dict(all_parsers(build_parser()))
    # the walk reaches the nested commands too
    assert {"zbrl", "zbrl train", "zbrl eval", "zbrl models pull", "zbrl plan"} <= set(parsers)
    for command, parser in parsers.items():
        text = parser.format_help()
        assert "``" not in text, f"{command} --help shows RST markup:\n{text}"
        assert ":mod:" not in text and ":func:" not in text, command
