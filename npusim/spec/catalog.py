"""Named YAML specs (chips, systems, models, plans): find by name or path, resolve `inherits:`, apply overrides."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from npusim.errors import NpusimError, did_you_mean
from npusim.memo import Lru
from npusim.spec.schema import BuildContext, Leaf, build, merge, normalise, read_yaml, set_path, setting


_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def data_root() -> Path:
    """The repo root holding hardware/ and workloads/ (NPUSIM_HOME overrides, for installed copies)."""
    env = os.environ.get("NPUSIM_HOME")
    return Path(env) if env else _PACKAGE_ROOT


def display_path(path: Path) -> str:
    """A path as a user would type it: relative to the current directory or the repo when possible."""
    for base in (Path.cwd(), data_root()):
        try:
            return str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(path)


@dataclass(frozen=True)
class Provenance:
    """Where a built spec came from: its file and, per dotted field, the source text and the file that set it."""

    file: str
    sources: dict[str, str]
    files: dict[str, str]
    written: dict[str, str] = dataclasses.field(default_factory=dict)  # an override's spec path -> the user's name

    def where(self, path: str) -> dict:
        """file= and field= of an error about field `path`: the spec's file, or an override's own origin and the name
        the user gave it there (a section is named as its first overridden leaf is)."""
        if path in self.written:
            return {"file": self.files[path], "field": self.written[path]}
        inner = next((k for k in self.written if k.startswith(path + ".")), None)
        if inner is not None:
            name = self.written[inner]
            return {"file": self.files[inner], "field": name[: len(name) - len(inner) + len(path)]}
        return {"file": self.file, "field": path}


_LOADED: Lru[object] = Lru(512)  # Catalog.load's memo


# while pinned: the file digest per (directory, name, cwd), and a directory's names per (directory, "*", cwd)
_PINNED: dict[tuple[str, str, str], str | list[str]] | None = None


def clear_loaded() -> None:
    _LOADED.clear()
    if _PINNED is not None:
        _PINNED.clear()


def pin_files(on: bool = True) -> None:
    """While pinned, Catalog.load reads the files a name can reach once, not at every load, and Catalog.names lists a
    directory once: a sweep takes its files as fixed while it runs (its point cache keys every point by one
    fingerprint of them, taken once), and reading the catalog directories was 40 % of a warm point's CPU. Unpinning
    forgets the digests."""
    global _PINNED
    _PINNED = {} if on else None


@contextmanager
def files_pinned():
    """Files pinned (`pin_files`) for the duration, unless they already are (a caller's pin is left as it was): a
    plan search loads the same chip, system and model files at each of its thousand predictions."""
    if _PINNED is not None:
        yield
        return
    pin_files()
    try:
        yield
    finally:
        pin_files(False)


@dataclass(frozen=True)
class Catalog:
    """One kind of spec stored as `<dir>/<name>.yaml`."""

    kind: str
    subdir: str
    cls: type
    require_sources: bool = True

    @property
    def directory(self) -> Path:
        return data_root() / self.subdir

    def names(self) -> list[str]:
        """The names in the directory (listed once while pinned: a sweep's every point checks its chip's name)."""
        where = (str(self.directory), "*", os.getcwd())
        if _PINNED is not None and where in _PINNED:
            return list(_PINNED[where])
        names = sorted(p.stem for p in self.directory.glob("*.yaml"))
        if _PINNED is not None:
            _PINNED[where] = names
        return list(names)

    def path_of(self, name: str) -> Path:
        p = Path(name)
        if p.suffix in (".yaml", ".yml") or os.sep in name or "/" in name:
            if not p.exists():
                raise NpusimError(f"no such {self.kind} file", file=name)
            return p
        p = self.directory / f"{name}.yaml"
        if not p.exists():
            raise NpusimError(f"unknown {self.kind} '{name}'" + did_you_mean(name, self.names()))
        return p

    def raw(self, name: str, _seen: tuple[str, ...] = ()) -> tuple[dict, str]:
        """The normalised tree of `name` with its parents merged underneath, and its display file name."""
        path = self.path_of(name)
        shown = display_path(path)
        data = read_yaml(path, shown)
        parent = data.pop("inherits", None)
        tree = normalise(data, shown)
        if parent is not None:
            if not isinstance(parent, str):
                raise NpusimError(f"must name one {self.kind}", file=shown, field="inherits")
            if parent in _seen:
                raise NpusimError(f"inherits in a cycle ({' -> '.join(_seen + (parent,))})", file=shown, field="inherits")
            if not (self.directory / f"{parent}.yaml").exists():
                raise NpusimError(f"unknown {self.kind} '{parent}'" + did_you_mean(parent, self.names()),
                                  file=shown, field="inherits")
            base, _ = self.raw(parent, _seen + (name,))
            tree = merge(base, tree)
        if "name" not in tree or tree["name"].file != shown:
            tree["name"] = Leaf(path.stem, None, shown)
        return tree, shown

    def load(self, name: str, overrides: dict[str, str] | None = None):
        """The built spec, memoised: a sweep loads the same chip, system, model and plan at every point, and building
        (type hints, units, checks) costs more than a warm prediction's engine work. The key is the name, the
        overrides in order, the working directory and data root (provenance names files relative to them) and the
        contents of every file the name can reach; a spec is frozen, so sharing it is safe."""
        def build() -> object:
            tree, shown = self.raw(name)
            return self.from_tree(tree, shown, overrides)

        return _LOADED.get(self._load_key(name, overrides), build)

    def _load_key(self, name: str, overrides: dict[str, str] | None) -> tuple:
        over = tuple((k, repr(v)) for k, v in (overrides or {}).items())
        return (self.kind, self.subdir, name, over, os.getcwd(), str(data_root()), self._digest(name))

    def _digest(self, name: str) -> str:
        """A digest of the contents of every file the name can reach (read once per name while pinned)."""
        where = (str(self.directory), name, os.getcwd())
        if _PINNED is not None and where in _PINNED:
            return _PINNED[where]
        h = hashlib.blake2b(digest_size=16)
        for f in sorted(self.directory.glob("*.yaml")) + [Path(name)]:
            try:
                h.update(str(f).encode() + b"\0" + f.read_bytes() + b"\0")
            except OSError:
                continue
        if _PINNED is not None:
            _PINNED[where] = h.hexdigest()
        return h.hexdigest()

    def from_tree(self, tree: dict, shown: str, overrides: dict[str, str] | None = None):
        """Build and check a spec from a normalised tree (a catalog file, or a foreign format mapped onto ours)."""
        for dotted, value in (overrides or {}).items():
            value = setting(value, "--set", dotted)
            set_path(tree, dotted, value, value.file, value.field or dotted)
        prepare = getattr(self.cls, "prepare", None)  # a spec's own reading of the tree (e.g. layered fields)
        if prepare is not None:
            tree = prepare(tree)
        ctx = BuildContext(shown, self.require_sources)
        obj = build(self.cls, tree, ctx)
        provenance = Provenance(shown, ctx.sources, ctx.files, ctx.written)
        obj = dataclasses.replace(obj, provenance=provenance)
        check = getattr(obj, "check", None)
        if check:
            for path, message in check():
                raise NpusimError(message, **provenance.where(path))
        return obj
