"""A dataset's directory tree, derived from its manifest, for lookups and listings by the FUSE layer.

Nodes are numbered: directories 0..D-1 (0 is the dataset's root), then files D..D+F-1 ordered by
(directory, name), so that the files directly inside a directory are one contiguous run. A lookup is a dict
probe for subdirectories and a binary search over that run for files; a listing offset is a position in it.
Per file this costs one 8-byte array slot on top of the manifest, not a dict entry.

A directory's time is the newest of the files beneath it: object stores keep no times for folders, and a
dataset is immutable while mounted, so that is the last time its contents changed, which is what a
directory's modification time says.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from silodlib.manifest import Manifest

NO_FILES_BENEATH = -(2**63)  # a directory's time where no file lies beneath it: the least 64 bits hold


@dataclass(slots=True)
class Directory:
    """One directory: its place in the tree and the run of its files in `DatasetTree.file_order`."""

    name: str
    parent: int
    subdirs: dict[str, int] = field(default_factory=dict)
    files_start: int = 0
    files_end: int = 0


class DatasetTree:
    """Directories and files of one dataset, addressed by node number."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.dirs: list[Directory] = [Directory("", 0)]
        self._dir_index: dict[str, int] = {"": 0}
        parents = array("q", (self._ensure_dir(path.rpartition("/")[0]) for path in manifest.paths))
        for path in manifest.empty_dirs:
            self._ensure_dir(path)
        # A stable sort by directory keeps name order inside each directory (paths are sorted).
        self.file_order = array("q", sorted(range(len(parents)), key=parents.__getitem__))
        position = 0
        for dir_id, directory in enumerate(self.dirs):
            directory.files_start = position
            while position < len(self.file_order) and parents[self.file_order[position]] == dir_id:
                position += 1
            directory.files_end = position
        self._dir_index.clear()  # only needed while building
        self.dir_mtimes_ns = self._newest_beneath(parents)

    def _newest_beneath(self, parents: array[int]) -> array[int]:
        """Per directory, the newest modification time of the files beneath it; NO_FILES_BENEATH where none
        is. A directory is numbered after its parent (`_ensure_dir`), so one pass from the last folds every
        directory into its parent after all of its own subdirectories have been folded into it."""
        newest = array("q", [NO_FILES_BENEATH]) * len(self.dirs)
        for parent, mtime_ns in zip(parents, self.manifest.mtimes_ns, strict=True):
            newest[parent] = max(newest[parent], mtime_ns)
        for dir_id in range(len(self.dirs) - 1, 0, -1):
            parent = self.dirs[dir_id].parent
            newest[parent] = max(newest[parent], newest[dir_id])
        return newest

    def _ensure_dir(self, path: str) -> int:
        existing = self._dir_index.get(path)
        if existing is not None:
            return existing
        parent_path, _, name = path.rpartition("/")
        parent = self._ensure_dir(parent_path)
        dir_id = len(self.dirs)
        self.dirs.append(Directory(name, parent))
        self.dirs[parent].subdirs[name] = dir_id
        self._dir_index[path] = dir_id
        return dir_id

    @property
    def node_count(self) -> int:
        return len(self.dirs) + len(self.file_order)

    def is_dir(self, node: int) -> bool:
        return node < len(self.dirs)

    def file_index(self, node: int) -> int:
        """The manifest index of file `node`."""
        return self.file_order[node - len(self.dirs)]

    def name(self, node: int) -> str:
        if self.is_dir(node):
            return self.dirs[node].name
        return self.manifest.paths[self.file_index(node)].rpartition("/")[2]

    def lookup(self, dir_node: int, name: str) -> int | None:
        """The node called `name` in directory `dir_node`, or None."""
        directory = self.dirs[dir_node]
        subdir = directory.subdirs.get(name)
        if subdir is not None:
            return subdir
        low, high = directory.files_start, directory.files_end
        while low < high:
            middle = (low + high) // 2
            candidate = self.name(len(self.dirs) + middle)
            if candidate == name:
                return len(self.dirs) + middle
            if candidate < name:
                low = middle + 1
            else:
                high = middle
        return None

    def entry_count(self, dir_node: int) -> int:
        directory = self.dirs[dir_node]
        return len(directory.subdirs) + directory.files_end - directory.files_start

    def entries(self, dir_node: int, start: int = 0) -> Iterator[int]:
        """The nodes in directory `dir_node` from listing position `start`: subdirectories, then files.

        Positions are stable (the tree never changes), so a listing resumed at any offset is exact.
        """
        directory = self.dirs[dir_node]
        subdirs = list(directory.subdirs.values())
        for position in range(start, self.entry_count(dir_node)):
            if position < len(subdirs):
                yield subdirs[position]
            else:
                yield len(self.dirs) + directory.files_start + position - len(subdirs)
