"""torch's private names, used behind one door and only on a torch they were tested with.

If these fail, a torch release that renamed or changed one of its internals
could load a checkpoint wrongly instead of slowly, or a private name crept
into a module where the version gate does not guard it.
"""

from __future__ import annotations

import ast
import importlib
import io
import zipfile
from pathlib import Path
from typing import cast

import pytest
import torch
from torch_helpers import build_model, payload_path, same_tensors, snapshot_state, train_steps

import launchhelm as lh
import launchhelm.torch as lht
from launchhelm.torch import _inplace, _torch_private

PACKAGE = Path(lh.__file__).resolve().parent
DOOR = PACKAGE / "torch" / "_torch_private.py"
#: The receivers whose private attributes are a module's own, not torch's.
OWN = ("self", "cls")


def _zip_crcs(path: Path) -> list[int]:
    with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as archive:
        return [info.CRC for info in archive.infolist() if "/data/" in info.filename and info.file_size]


def test_the_gate_opens_only_on_a_tested_torch_with_every_private_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _torch_private.TESTED == ("2.13",)
    assert torch.__version__.startswith("2.13.")  # the torch these tests run on is a tested one
    assert _torch_private.missing_names() == []
    assert _torch_private.fast_path_available()
    for version, tested in (("2.13.1+cu128", True), ("2.12.0", False), ("2.14.0", False), ("3.13.0", False)):
        monkeypatch.setattr(_torch_private, "TORCH_VERSION", version)
        assert _torch_private.fast_path_available() is tested, version
    monkeypatch.setattr(_torch_private, "TORCH_VERSION", torch.__version__)
    # a torch that lacks one of the names (here, one that no torch has): the gate closes
    monkeypatch.setattr(_torch_private, "REQUIRED", (*_torch_private.REQUIRED, ("torch._C", "NoSuchReader")))
    assert _torch_private.missing_names() == ["torch._C.NoSuchReader"]
    assert not _torch_private.fast_path_available()


def test_an_untested_torch_saves_and_loads_through_torchs_own_path_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the gate closed a checkpoint is written with torch's zip CRC32s and loaded with
    torch.load(weights_only=True) and load_state_dict: bitwise the state saved, nothing read in
    place, and a flipped byte still refused (CRC64NVME) before anything is applied."""
    monkeypatch.setattr(_inplace, "IN_PLACE_MIN_BYTES", 0)  # the fast path would take even this small file
    store_url = str(tmp_path / "store")
    model, optimizer = build_model()
    tr = lht.init("door", store=store_url)
    tr.watch(model, optimizer)
    train_steps(model, optimizer, 2)
    fast = tr.save_checkpoint()
    assert fast is not None
    monkeypatch.setattr(_torch_private, "TORCH_VERSION", "2.12.0")
    assert not _torch_private.fast_path_available()
    train_steps(model, optimizer, 1)
    saved = snapshot_state(model, optimizer)
    artifact = tr.save_checkpoint()
    assert artifact is not None
    path = payload_path(store_url, tr, artifact)
    fast_path = path.parent.parent / fast / f"{fast}.pt"
    assert all(_zip_crcs(path)), "an untested torch saves with its own defaults"
    assert not any(_zip_crcs(fast_path)), "a tested torch skips the CRC32s that loads never read"

    train_steps(model, optimizer, 2)
    assert not same_tensors(saved, snapshot_state(model, optimizer))
    tr._checkpointer.loaded_in_place = -1
    tr.load_checkpoint(artifact)
    assert same_tensors(saved, snapshot_state(model, optimizer))  # bitwise, bf16 included
    assert tr._checkpointer.loaded_in_place == -1 and not tr._checkpointer.optimizer_in_place, "nothing went in place"
    tr.load_checkpoint(fast)  # a file the fast path wrote loads the slow way too
    assert tr._checkpointer.loaded_in_place == -1

    train_steps(model, optimizer, 1)
    trained = snapshot_state(model, optimizer)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(lh.CheckpointError, match="does not match its crc64nvme"):
        tr.load_checkpoint(artifact)
    assert same_tensors(trained, snapshot_state(model, optimizer)), "a corrupted file changed the model"
    tr.clear_checkpoint_error()

    monkeypatch.setattr(_torch_private, "TORCH_VERSION", torch.__version__)  # the gate opens again: in place
    tr.load_checkpoint(fast)
    assert tr._checkpointer.loaded_in_place > 0
    tr.finish()


def _private_names_of_torch() -> set[str]:
    """The private attribute names torch's own objects carry, as torch itself makes them: a module,
    an optimizer with state, a tensor, a parameter, and the storage of a tensor that
    torch.load(map_location="meta") made (where it records the file offset)."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    buffer = io.BytesIO()
    torch.save({"t": torch.ones(2)}, buffer)
    buffer.seek(0)
    meta = torch.load(buffer, map_location="meta", weights_only=True)["t"]
    found: set[str] = set()
    for obj in (model, optimizer, torch.ones(1), model.weight, meta.untyped_storage(), torch.nn.Module):
        found.update(n for n in dir(obj) if n.startswith("_") and not n.startswith("__"))
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _torch_bindings(tree: ast.AST) -> dict[str, str]:
    """The names a module binds to torch's modules and objects, each to its full dotted name:
    ``from torch.a import b`` (``b``: ``torch.a.b``), ``from torch.a import b as c``,
    ``import torch.a as c`` (``c``: ``torch.a``). One namespace for the whole file: a name bound
    to torch anywhere (a function's local import) counts everywhere."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch" and alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _resolve(dotted: str, bound: dict[str, str]) -> str:
    """``dotted`` with its first name replaced by the torch name it was bound to, if any."""
    head, _, rest = dotted.partition(".")
    if head in bound:
        return f"{bound[head]}.{rest}" if rest else bound[head]
    return dotted


def _torch_object(dotted: str) -> object | None:
    """The torch module or object a dotted name reaches (None where it reaches none)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part, None)
            if found is None:
                return None
        return found
    return None


def _private_uses(path: Path, torch_names: set[str]) -> list[str]:
    """Where a module uses a private name of torch's: a private torch module or attribute reached
    through ``torch.`` or through a name bound by ``from torch... import`` / ``import torch.x as y``
    (import, attribute, or a string naming it: dotted, a ``("torch.module", "_name")`` pair, or a
    private name that a torch module or object the file binds has), or a private attribute torch's
    objects carry, read off anything but the module's own objects (``self``, ``cls``)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    bound = _torch_bindings(tree)
    # what the file's torch names reach, for strings handed to getattr() and the like
    reached = [obj for obj in (_torch_object(name) for name in sorted(set(bound.values()))) if obj is not None]
    shown = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
    found = []

    def torch_private(dotted: str) -> bool:
        parts = _resolve(dotted, bound).split(".")
        return parts[0] == "torch" and any(_is_private(part) for part in parts[1:])

    def strings(node: ast.AST) -> list[str] | None:
        if isinstance(node, ast.Tuple) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
        ):
            return [cast("ast.Constant", e).value for e in node.elts]
        return None

    for node in ast.walk(tree):
        where = f"{shown}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names if torch_private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "torch" and (
                torch_private(node.module) or any(_is_private(a.name) for a in node.names)
            ):
                found.append(f"{where} from {node.module} import ...")
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None and torch_private(dotted):
                found.append(f"{where} {_resolve(dotted, bound)}")
            elif node.attr in torch_names and not (isinstance(node.value, ast.Name) and node.value.id in OWN):
                found.append(f"{where} .{node.attr}")
        elif (pair := strings(node)) is not None and len(pair) == 2:
            if pair[0].split(".")[0] == "torch" and _is_private(pair[1]):
                found.append(f"{where} {tuple(pair)!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
            named = text in torch_names or (text.split(".")[0] == "torch" and torch_private(text))
            # a bare private name that a torch module or object the file binds has (getattr's argument)
            held = _is_private(text) and text.isidentifier() and any(hasattr(obj, text) for obj in reached)
            if named or held:
                found.append(f"{where} {text!r}")
    return found


def _outside_door(paths: list[Path], torch_names: set[str]) -> list[str]:
    return [use for path in paths if path != DOOR for use in _private_uses(path, torch_names)]


@pytest.mark.slow
def test_torchs_private_names_are_used_only_behind_the_door() -> None:
    """Every use of a private torch name lives in launchhelm/torch/_torch_private.py, behind
    fast_path_available(); no allow-list is needed elsewhere. The scan itself is checked on the
    door, where it must find the names the fast path relies on."""
    torch_names = _private_names_of_torch()
    assert {"_checkpoint_offset", "_non_persistent_buffers_set", "_optimizer_load_state_dict_pre_hooks"} <= torch_names
    elsewhere = _outside_door(sorted(PACKAGE.rglob("*.py")), torch_names)
    assert elsewhere == [], "private torch names outside _torch_private.py:\n" + "\n".join(elsewhere)
    door = "\n".join(_private_uses(DOOR, torch_names))
    expected = (
        "torch._C.PyTorchFileReader",
        "'_checkpoint_offset'",
        "._non_persistent_buffers_set",
        "'torch._utils'",
        # reached through names bound by `from torch... import`, and named in (module, name) pairs
        "torch.distributed.checkpoint.filesystem._StorageInfo",
        "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
        "('torch.serialization', '_get_layout')",
        "from torch.distributed.tensor._utils import ...",
        "torch._C._distributed_c10d._dump_fr_trace_json",  # the flight recorder of a hang's record
    )
    for name in expected:
        assert name in door, name


#: Ways a private torch name can slip into a module, each with what the scan must report.
VIOLATIONS = {
    "from-import binding": (
        "from torch.distributed.checkpoint import filesystem\ninfo = filesystem._StorageInfo\n",
        "torch.distributed.checkpoint.filesystem._StorageInfo",
    ),
    "import-as binding": (
        "import torch.serialization as ser\nget = ser._get_layout\n",
        "torch.serialization._get_layout",
    ),
    "from-import alias": (
        "from torch.distributed.checkpoint import metadata as md\nenc = md._MEM_FORMAT_ENCODING\n",
        "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    ),
    "a private name imported": ("from torch.serialization import _get_layout\n", "from torch.serialization import"),
    "a (module, name) pair": ('ALLOWED = {("torch.serialization", "_get_layout"): None}\n', "'_get_layout')"),
    "a name handed to getattr": (
        "def f():\n    from torch.distributed.checkpoint import metadata\n\n"
        '    return getattr(metadata, "_MEM_FORMAT_ENCODING")\n',
        "'_MEM_FORMAT_ENCODING'",
    ),
    "torch-rooted": ("import torch\nreader = torch._C.PyTorchFileReader\n", "torch._C.PyTorchFileReader"),
}


@pytest.mark.parametrize("kind", sorted(VIOLATIONS))
def test_the_scan_fails_on_a_private_torch_name_outside_the_door(tmp_path: Path, kind: str) -> None:
    """A module outside the door that uses a private torch name in any of these ways makes the
    scan above report it (by file and line), where before it could pass unseen: the scan runs on
    the package's files plus one written here."""
    source, reported = VIOLATIONS[kind]
    bad = tmp_path / "leaky.py"
    bad.write_text(source)
    torch_names = _private_names_of_torch()
    clean = tmp_path / "clean.py"
    clean.write_text(
        "import torch\nfrom torch.distributed.checkpoint import metadata\n"
        'meta = getattr(metadata, "Metadata")\nsize = torch.Size\n_mine = 1\nname = "_mine"\n'
    )
    assert _outside_door([clean], torch_names) == []
    found = _outside_door([*sorted((PACKAGE / "torch").rglob("*.py")), bad], torch_names)
    assert found, f"the scan missed a {kind}"
    assert all(use.startswith(str(bad)) for use in found), found
    assert any(reported in use for use in found), found
