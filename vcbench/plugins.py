"""Plugins: code from outside the package that registers methods, backends, models or metrics.

Three ways in, with the same effect:

    entry points     a distribution declares, in its pyproject.toml,
                         [project.entry-points."vcbench.methods"]
                         my-int8 = "my_pkg.attention:METHOD"
                     (groups vcbench.methods, vcbench.backends, vcbench.models, vcbench.metrics)
    --plugin SPEC    on any command, repeatable
    VCBENCH_PLUGINS  SPEC[:SPEC...] (os.pathsep between them), for every command of a shell

A SPEC is a module name (`my_pkg.attention`), a Python file (`./my_kernel.py`) or a method file
(`.yaml`, `.yml`, `.toml`: a plan built from the spec's blocks, vcbench/kernels/spec/method_file.py).
An entry point's object is registered in its group's registry when it is an entry (a Method,
KernelMethod, Backend, ModelEntry or MetricEntry), called when it is a function (which then
registers what it likes), and a module registers what it likes when imported.

Whatever fails (a module that does not import, a name a built-in already has) is one UserError
naming the plugin. Every run folder records what was loaded (`provenance()`): the module or
file, its distribution's version or the file's sha256, and the names it registered, so a
report can still show a plugin's rows on a machine that lacks it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from vcbench.errors import UserError
from vcbench.registry import (
    Origin,
    before_first_lookup,
    loaded_plugins,
    record_plugin,
    registering_as,
)

ENV = "VCBENCH_PLUGINS"
GROUPS = ("vcbench.methods", "vcbench.backends", "vcbench.models", "vcbench.metrics")
METHOD_FILE_SUFFIXES = (".yaml", ".yml", ".toml")


@dataclass
class LoadedPlugin:
    spec: str  # as given: module name, path, or "distribution:entry point"
    origin: Origin
    registered: list[str] = field(default_factory=list)  # "method my-int8", ...

    def record(self) -> dict[str, Any]:
        return {"plugin": self.spec, "kind": self.origin.kind, "source": self.origin.source,
                "version": self.origin.version, "registered": self.registered}


_loaded: dict[str, LoadedPlugin] = {}  # by spec, in load order
_defaults_loaded = False


def registries() -> dict[str, Any]:
    """Each entry-point group's registry (imported here: their modules import this one's)."""
    from vcbench.kernels import METHODS
    from vcbench.kernels.backends import BACKENDS
    from vcbench.metrics import METRICS
    from vcbench.pipelines.registry import MODELS

    return {r.group: r for r in (METHODS, BACKENDS, MODELS, METRICS)}


def load_default() -> None:
    """Entry points, then VCBENCH_PLUGINS: once per process, before the first lookup."""
    global _defaults_loaded
    if _defaults_loaded:
        return
    _defaults_loaded = True  # first: what a plugin registers looks entries up too
    groups = registries()  # the built-ins register as their modules import
    for group in GROUPS:
        for ep in metadata.entry_points(group=group):
            _load_entry_point(ep, groups[group])
    for spec in split_env(os.environ.get(ENV, "")):
        load(spec)


before_first_lookup(load_default)


def split_env(text: str) -> list[str]:
    return [s.strip() for s in text.split(os.pathsep) if s.strip()]


def load(spec: str) -> LoadedPlugin:
    """Load one `--plugin` SPEC (module name, .py file or method file); loading it twice is
    loading it once."""
    load_default()
    if spec in _loaded:
        return _loaded[spec]
    path = Path(spec)
    looks_like_file = path.suffix in (".py", *METHOD_FILE_SUFFIXES) or os.sep in spec
    if looks_like_file:
        if not path.is_file():
            raise UserError(f"plugin {spec}: no such file")
        origin = Origin("file", str(path.resolve()), "sha256:" + _sha256(path))
        if path.suffix in METHOD_FILE_SUFFIXES:
            return _track(spec, origin, lambda: _register_method_file(path))
        return _track(spec, origin, lambda: _import_file(path))
    module = spec
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise UserError(f"plugin {spec!r}: no module of that name (a module on the Python path, "
                        "a .py file or a method file)")
    origin = Origin("module", module, _module_version(module, found.origin))
    return _track(spec, origin, lambda: _import_module(spec, module))


def provenance() -> list[dict[str, Any]]:
    """What every loaded plugin is and registered, for a run folder's manifest."""
    return loaded_plugins()


def _track(spec: str, origin: Origin, do) -> LoadedPlugin:
    plugin = LoadedPlugin(spec, origin)
    groups = registries()
    before = {g: set(r._entries) for g, r in groups.items()}
    with registering_as(origin):
        do()
    for g, r in groups.items():
        plugin.registered += [f"{r.kind} {n}" for n in r._entries if n not in before[g]]
    _loaded[spec] = plugin
    record_plugin(plugin.record())
    return plugin


def _load_entry_point(ep, registry) -> None:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) or "?"
    version = getattr(dist, "version", None)
    spec = f"{name}:{ep.group}:{ep.name}"
    origin = Origin("entry point", f"{name} ({ep.group} {ep.name} = {ep.value})", version)

    def do() -> None:
        try:
            obj = ep.load()
        except Exception as e:
            raise UserError(f"plugin {spec}: entry point {ep.value!r} does not load: "
                            f"{type(e).__name__}: {e}") from e
        _register_object(obj, registry, spec)
    _track(spec, origin, do)


def _register_object(obj: Any, registry, spec: str) -> None:
    if isinstance(obj, ModuleType):
        return  # importing it registered what it has
    if callable(obj) and not isinstance(obj, type) and not hasattr(obj, "name"):
        obj()  # a function that registers
        return
    if not hasattr(obj, "name"):
        raise UserError(f"plugin {spec}: {type(obj).__name__} is not a {registry.kind} entry, "
                        "a module or a function")
    registry.register(obj)


def _register_method_file(path: Path) -> None:
    from vcbench.kernels import METHODS
    from vcbench.kernels.spec.method_file import load_method_file

    METHODS.register(load_method_file(path))


def _import_module(spec: str, module: str) -> None:
    try:
        importlib.import_module(module)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"plugin {spec!r} does not import: {type(e).__name__}: {e}") from e


def _import_file(path: Path) -> None:
    name = f"vcbench_plugin_{path.stem.replace('-', '_')}_{_sha256(path)[:8]}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UserError(f"plugin {path}: not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except UserError:
        sys.modules.pop(name, None)
        raise
    except Exception as e:
        sys.modules.pop(name, None)
        raise UserError(f"plugin {path} does not import: {type(e).__name__}: {e}") from e


def _module_version(module: str, file: str | None) -> str | None:
    """The installed distribution's version, else the module file's sha256."""
    top = module.split(".")[0]
    for dist in metadata.packages_distributions().get(top, []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    if file and Path(file).is_file():
        return "sha256:" + _sha256(Path(file))
    return None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
