"""Bytes of tensor storage a rank holds, counted as operators create and free storages.

Hand-written rather than torch's `MemTracker` (torch.distributed._tools), which this
follows in how it finds storages: MemTracker also attributes memory to every module, with
hooks at each module call and a walk over every tracked module at each operator (several
times slower on a model of CREDIT's size), and it refuses a model called twice in one step,
which multi-step forecasts and gradient accumulation do. `credit plan` needs the totals only.
"""

from __future__ import annotations

import weakref
from functools import wraps
from typing import Any

import torch
import torch.distributed._tools.fake_collectives  # noqa: F401  (collectives on fake tensors)
from torch._guards import active_fake_mode
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class StorageBytes(TorchDispatchMode):
    """Within the mode: `current` bytes of the storages alive that it has seen (created by an
    operator, resized, or passed to `hold`), and their `peak` since entry or `reset_peak()`.

    FSDP2 frees and refills its gathered parameters by resizing their storages in place
    (`UntypedStorage.resize_`, which no operator sees), so the mode follows resizes too.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._counted: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> [bytes, weakref]
        self._resize = None  # torch's resize_, while the mode replaces it
        self._fake_mode = None

    def hold(self, *objects: Any) -> None:
        """Count the storages of tensors made before the mode: any nesting of tensors,
        modules (parameters, gradients, buffers) and optimizers (state)."""
        for obj in tree_flatten(list(objects))[0]:
            if isinstance(obj, torch.nn.Module):
                self.hold([*obj.parameters(), *obj.buffers()], [p.grad for p in obj.parameters()])
            elif isinstance(obj, torch.optim.Optimizer):
                self.hold([list(state.values()) for state in obj.state.values()])
            elif isinstance(obj, torch.Tensor):
                self._count(obj)

    def reset_peak(self) -> None:
        self.peak = self.current

    def _count(self, tensor: torch.Tensor) -> None:
        for storage in get_untyped_storages(tensor):
            if storage not in self._counted:
                self._add(storage)

    def _add(self, storage: torch.UntypedStorage) -> None:
        entry = [storage.nbytes(), None]

        def release(_ref: weakref.ref, entry: list = entry) -> None:
            self.current -= entry[0]

        entry[1] = weakref.ref(storage, release)
        self._counted[storage] = entry
        self._grow(entry[0])

    def _grow(self, nbytes: int) -> None:
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def __enter__(self) -> StorageBytes:
        self._fake_mode = active_fake_mode()
        resize = self._resize = torch.UntypedStorage.resize_
        counter = self

        @wraps(resize)
        def counted_resize(storage: torch.UntypedStorage, size: int) -> None:
            resize(storage, size)
            entry = counter._counted.get(storage)
            if entry is None:
                counter._add(storage)
            else:
                change, entry[0] = storage.nbytes() - entry[0], storage.nbytes()
                counter._grow(change)

        torch.UntypedStorage.resize_ = counted_resize
        try:
            return super().__enter__()
        except BaseException:
            torch.UntypedStorage.resize_ = resize
            raise

    def __exit__(self, *args: Any) -> None:
        torch.UntypedStorage.resize_ = self._resize
        self._resize = None
        super().__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor dispatches its local operators, which are counted
        if func is torch.ops._c10d_functional.wait_tensor.default and self._fake_mode is not None:
            return args[0]  # eagerly, waiting returns its input; the fake kernel would make a copy
        out = func(*args, **(kwargs or {}))
        # DTensor propagates shardings under a fake mode of its own: those tensors are not memory
        if active_fake_mode() is self._fake_mode:
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor):
                    self._count(tensor)
        return out
