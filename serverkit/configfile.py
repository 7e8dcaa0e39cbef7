"""A server's settings as one typed dataclass, loaded from a TOML file, then the environment, then flags.

The broker (broker/config.py) and the NameServer (namesrv/config.py) share these mechanics. A key is a field name
of the dataclass (RocketMQ's camelCase name where RocketMQ has the setting); its environment variable is
ROCKETRAFT_<KEY_IN_UPPER_SNAKE> and its flag --<key>. Later sources override earlier ones. A file key or a
ROCKETRAFT_ variable that is almost a key's name (a typo) is refused naming the key meant: read as nothing, it would
leave that setting (a password, a port) at its default without a word.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

C = TypeVar("C")
ENV_PREFIX = "ROCKETRAFT_"
FLAG_DEST_PREFIX = "cfg_"  # argparse dest of --<key>: cfg_<key>
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def upper_snake_env(key: str) -> str:
    """ROCKETRAFT_<UPPER_SNAKE>: listenPort -> ROCKETRAFT_LISTEN_PORT."""
    return ENV_PREFIX + re.sub(r"(?<!^)(?=[A-Z])", "_", key).upper()


class ConfigKeys(Generic[C]):
    """The keys of one server's config dataclass `kind`, and how each source spells them.

    `server` names the server in messages ("broker"); `help_hint` says where every key is listed; `extra_env`
    are other ROCKETRAFT_ variables this server reads (old names), never taken for a misspelt key."""

    def __init__(self, kind: type[C], server: str, help_hint: str,
                 env_name: Callable[[str], str] = upper_snake_env, extra_env: Iterable[str] = ()):
        self.kind, self.server, self.help_hint, self.env_name = kind, server, help_hint, env_name
        self.names = tuple(f.name for f in dataclasses.fields(kind))
        self.defaults = {name: getattr(kind(), name) for name in self.names}
        self._env = {env_name(name): name for name in self.names}
        self._known_env = frozenset(self._env) | frozenset(extra_env)

    # -- the sources, each a dict of key -> raw value ---------------------------------------------------------

    def from_file(self, path: str | None) -> dict[str, Any]:
        if not path:
            return {}
        with open(path, "rb") as f:
            data = tomllib.load(f)
        unknown = sorted(set(data) - set(self.names))
        if unknown:
            hints = "; ".join(self._hint(key) for key in unknown)
            raise ValueError(f"{path}: unknown keys {unknown} ({hints}); known keys: {sorted(self.names)}")
        return data

    def from_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        env = os.environ if environ is None else environ
        self._refuse_misspelt_env(env)
        return {key: env[name] for name, key in self._env.items() if name in env}

    def from_flags(self, args: argparse.Namespace) -> dict[str, Any]:
        return {key: getattr(args, FLAG_DEST_PREFIX + key, None) for key in self.names}

    # -- building ----------------------------------------------------------------------------------------------

    def build(self, *sources: Mapping[str, Any]) -> C:
        """The config from `sources`, later ones overriding earlier ones (None: not given); not validated."""
        values: dict[str, Any] = {}
        for source in sources:
            values.update({k: v for k, v in source.items() if v is not None})
        return self.kind(**{k: self.coerce(k, v) for k, v in values.items()})

    def coerce(self, key: str, value: Any) -> Any:
        kind = type(self.defaults[key])
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        if kind is bool:
            if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
                return value.lower() in _TRUE
            raise ValueError(f"{key}: {value!r} is not a boolean (true/false)")
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}: {value!r} is not a valid {kind.__name__}") from None

    def add_arguments(self, parser: argparse.ArgumentParser, config_help: str,
                      key_help: Mapping[str, str] | None = None) -> None:
        """--config/-c FILE and one --<key> VALUE per key; its help: `key_help[key]`, the variable, the default."""
        parser.add_argument("--config", "-c", help=config_help)
        for name in self.names:
            meaning = (key_help or {}).get(name, "")
            parser.add_argument(f"--{name}", dest=FLAG_DEST_PREFIX + name, default=None, metavar="VALUE",
                                help=f"{meaning + ' ' if meaning else ''}(env {self.env_name(name)}; default "
                                     f"{self.defaults[name]!r})")

    def to_toml(self, config: C) -> str:
        lines = []
        for key, value in dataclasses.asdict(config).items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, int | float):
                lines.append(f"{key} = {value!r}")
            else:
                lines.append(f'{key} = "{value}"')
        return "\n".join(lines) + "\n"

    # -- typos -------------------------------------------------------------------------------------------------

    def nearest(self, key: str) -> str | None:
        """The known key most like `key` (case aside), if any is close."""
        lowered = {name.lower(): name for name in self.names}
        close = difflib.get_close_matches(key.lower(), lowered, n=1, cutoff=0.6)
        return lowered[close[0]] if close else None

    def _hint(self, key: str) -> str:
        near = self.nearest(key)
        return f"{key}: did you mean {near}?" if near else f"{key}: no key is like it; {self.help_hint}"

    def _refuse_misspelt_env(self, env: Mapping[str, str]) -> None:
        """A ROCKETRAFT_ variable that differs from a key's only in its underscores is refused (other tools'
        variables pass)."""
        wanted = {name.replace("_", ""): name for name in self._env}
        for name in env:
            if name.startswith(ENV_PREFIX) and name not in self._known_env:
                right = wanted.get(name.replace("_", ""))
                if right is not None:
                    raise ValueError(f"environment variable {name}: not a {self.server} key's name; did you mean "
                                     f"{right}? ({self.help_hint})")
