"""One idiom for everything a user can add: methods, backends, models and metrics.

    from vcbench.kernels import METHODS
    METHODS.register(my_method)          # the entry carries its own name
    METHODS.get("vc-8bit")               # unknown: one UserError naming the known entries
    list(METHODS), "vc-8bit" in METHODS, METHODS.origin("vc-8bit")

Each registry lives beside what it holds (`vcbench.kernels.METHODS`,
`vcbench.kernels.backends.BACKENDS`, `vcbench.pipelines.registry.MODELS`,
`vcbench.metrics.METRICS`) and registers its built-ins when that module is imported, exactly as
a plugin registers its own entries. Plugins (vcbench/plugins.py: entry points, `--plugin`,
VCBENCH_PLUGINS) are loaded the first time any registry is asked for an entry, so a name from
a plugin resolves wherever a built-in's does.

A registry keeps registration order: the backends' order is their priority.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from vcbench.errors import UserError, did_you_mean

T = TypeVar("T")


@dataclass(frozen=True)
class Origin:
    """Where an entry came from: `built-in`, or the plugin that registered it (a module, an
    entry point, or a file, with the distribution's version or the file's sha256)."""

    kind: str  # "built-in" | "module" | "entry point" | "file"
    source: str = "vcbench"
    version: str | None = None

    @property
    def builtin(self) -> bool:
        return self.kind == "built-in"

    def describe(self) -> str:
        if self.builtin:
            return "built-in"
        return f"{self.source}" + (f" ({self.version})" if self.version else "")


BUILTIN = Origin("built-in")
# An entry registered from Python outside any plugin load (a user's script, a notebook).
FROM_PYTHON = Origin("python", "registered from Python")
_loading: list[Origin] = []  # the plugin being loaded (innermost last)


@contextmanager
def registering_as(origin: Origin) -> Iterator[None]:
    """Entries registered inside this block come from `origin` (a plugin being loaded)."""
    _loading.append(origin)
    try:
        yield
    finally:
        _loading.pop()


def current_origin() -> Origin:
    return _loading[-1] if _loading else FROM_PYTHON


class Registry(Generic[T]):
    """Name -> entry, in registration order. `kind` names an entry in errors ("method");
    `group` is the entry-point group plugins use ("vcbench.methods")."""

    def __init__(self, kind: str, group: str, name_of: Callable[[T], str] = lambda e: e.name):
        self.kind, self.group, self._name_of = kind, group, name_of
        self._entries: dict[str, T] = {}
        self._origins: dict[str, Origin] = {}
        self.on_register: list[Callable[[str, T, Origin], None]] = []

    def register(self, entry: T, *, replace: bool = False) -> T:
        """Add `entry` under its name. A second entry of the same name is a UserError (a
        plugin cannot shadow a built-in by accident) unless `replace`; registering the very
        same object again is a no-op (a plugin module imported twice)."""
        name = self._name_of(entry)
        if not isinstance(name, str) or not name.strip() or name != name.strip() or "," in name:
            raise UserError(f"a {self.kind} needs a non-empty name without commas or surrounding "
                            f"spaces, got {name!r}")
        origin = current_origin()
        old = self._entries.get(name)
        if old is entry:
            return entry
        if old is not None and not replace:
            raise UserError(f"{origin.describe()}: {self.kind} {name!r} is already registered "
                            f"({self._origins[name].describe()}); pick another name")
        self._entries[name] = entry
        self._origins[name] = origin
        for hook in self.on_register:
            hook(name, entry, origin)
        return entry

    def register_builtins(self, entries) -> None:
        """vcbench's own entries, in order (for backends: their priority)."""
        with registering_as(BUILTIN):
            for entry in entries:
                self.register(entry)

    def get(self, name: str) -> T:
        _load_plugins()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UserError(f"unknown {self.kind} {name!r} ({did_you_mean(name, self._entries)}"
                            f"known: {', '.join(self._entries)})") from None

    __getitem__ = get

    def origin(self, name: str) -> Origin:
        self.get(name)
        return self._origins[name]

    def names(self) -> list[str]:
        _load_plugins()
        return list(self._entries)

    def builtin_names(self) -> list[str]:
        """vcbench's own entries, without any plugin's."""
        return [n for n in self.names() if self._origins[n].builtin]

    def values(self) -> list[T]:
        _load_plugins()
        return list(self._entries.values())

    def items(self) -> list[tuple[str, T]]:
        _load_plugins()
        return list(self._entries.items())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        _load_plugins()
        return name in self._entries

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} entries)"


_plugin_records: list[dict] = []  # what vcbench.plugins loaded, for run folders


def record_plugin(record: dict) -> None:
    _plugin_records.append(record)


def loaded_plugins() -> list[dict]:
    """The plugins this process loaded, each with its source, version and what it registered
    (every manifest carries this: vcbench/runs.py)."""
    return list(_plugin_records)


_before_first_lookup: list[Callable[[], None]] = []


def before_first_lookup(load: Callable[[], None]) -> None:
    """Run `load` before any registry answers (vcbench.plugins puts its entry points and
    VCBENCH_PLUGINS here; this module imports nothing of the package, so no cycle)."""
    _before_first_lookup.append(load)


def _load_plugins() -> None:
    for load in _before_first_lookup:
        load()
