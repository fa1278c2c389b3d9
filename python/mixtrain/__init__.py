"""mixtrain from Python (docs/python.md): its C++ optimizer stack as torch.optim optimizers
(mixtrain.optim) and the trainer's checkpoints (mixtrain.checkpoint).

    import mixtrain.optim
    opt = mixtrain.optim.AdamW(model.parameters(), lr=1e-3)

The extension module mixtrain._C is built against one torch (the pinned wheel): its C++ code
binds to that torch's libraries, so under any other torch it is not loaded at all, and the
import fails with one message naming both versions.
"""

import torch as _torch

from ._build import COMMIT as _COMMIT
from ._build import TORCH_VERSION as _BUILT_FOR
from ._build import VERSION as __version__


def _check_torch():
    found = getattr(_torch, "__version__", "unknown")
    if found != _BUILT_FOR:
        raise ImportError(
            f"mixtrain {__version__} was built for torch {_BUILT_FOR}, but this Python imports "
            f"torch {found} (from {getattr(_torch, '__file__', '?')}); mixtrain's C++ code "
            f"cannot run with another torch. Use the environment it was built in (the "
            f"project's .venv: `make python`), or rebuild mixtrain against this torch "
            f"(cmake -DMIXTRAIN_PYTHON=<this python>)."
        )


_check_torch()

from . import _C  # noqa: E402  (only after the check)

__all__ = ["__version__", "torch_version", "commit"]
torch_version = _BUILT_FOR
commit = _COMMIT
