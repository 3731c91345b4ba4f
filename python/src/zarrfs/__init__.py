"""Python side of zarrfs.

zarrfs mounts a Zarr store as a read-only tree of ``.npy`` sample files. This
package talks to such a mount (or starts one); it never decodes Zarr itself.

- :class:`Mount`: run ``zarrfs mount`` for the life of a ``with`` block.
- :class:`SampleDir`: what a sample directory lists (from its sidecar).
- ``zarrfs.dali.numpy_reader``: DALI's numpy reader with matching sharding.
- ``xarray.open_dataset(MOUNT, engine="zarrfs")``: dims, coordinates and
  attributes from the sidecars, data read lazily per sample file.
- ``zarrfs.torch.SampleDataset``: a PyTorch map-style dataset of samples.

The optional modules import DALI, xarray or PyTorch only when used.
"""

from ._mount import Mount, MountError, find_binary, flag_args
from ._samples import SampleDir, shard_of

__all__ = ["Mount", "MountError", "SampleDir", "find_binary", "flag_args", "shard_of"]
__version__ = "0.1.0"
