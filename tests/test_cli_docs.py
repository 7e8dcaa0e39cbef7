"""docs/client.md's "Command line" section names every flag of `rocketraft send`, `recall`, `consume` and `admin`
(the user and ACL flags are docs/security.md's), so a new flag cannot go undocumented."""

from __future__ import annotations

import argparse
import pathlib
import re

import pytest

from cli import admin as cli_admin
from cli import auth as cli_auth
from cli import messaging as cli_client

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "client.md"
COMMANDS = {"send": cli_client.add_send_arguments, "recall": cli_client.add_recall_arguments,
            "consume": cli_client.add_consume_arguments, "admin": cli_admin.add_arguments}


def command_line_section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Command line")
    return text[start:text.index("\n## ", start + 1)]


def documented_flags(add_arguments) -> list[list[str]]:
    """The option strings of each flag the command takes, but -h and the user and ACL flags."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    auth = argparse.ArgumentParser()
    cli_auth.add_arguments(auth)
    auth_flags = {o for a in auth._actions for o in a.option_strings}
    return [a.option_strings for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction) and not set(a.option_strings) & auth_flags]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_command_line_section_names_every_flag_of(command):
    section = command_line_section()
    missing = [flags for flags in documented_flags(COMMANDS[command])
               if not any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", section) for f in flags)]
    assert not missing, f"docs/client.md, \"Command line\", names no flag of `rocketraft {command}` among {missing}"
