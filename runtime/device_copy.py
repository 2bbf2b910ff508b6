"""Host arrays to the device without making the host wait for the device."""

from __future__ import annotations

import numpy as np
import torch


def host_to_device(
    array: np.ndarray, device: torch.device | str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`array` as a tensor on `device` (converted to `dtype`, if given).

    On CUDA the copy goes through pinned memory and is queued behind the
    stream's work. A plain `.to(device)` from pageable memory synchronises
    the stream first: with async scheduling that would make the host wait for
    the step in flight, undoing the overlap. Pinned blocks come from torch's
    caching host allocator, which reuses a block only once the copies that
    read it are done.
    """
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if dtype is not None and dtype != tensor.dtype:
        tensor = tensor.to(dtype)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
