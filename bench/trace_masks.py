"""The bench scripts' trace reader: per layer, a [neurons][tokens] 0/1 numpy matrix of a trace v1 file (neuron-major
bitmaps, docs/formats.md). Needs numpy and h5py (Debian: python3-h5py)."""
import sys

import h5py
import numpy as np


def load_masks(path, dtype, tool):
    """Every layer's mask as a dtype matrix; exits with one line naming tool and path when the file is not a trace."""
    try:
        with h5py.File(path, "r") as f:
            nt = int(f.attrs["n_tokens"])
            layers = []
            for k in sorted(f["layers"].keys(), key=int):
                m = f["layers"][k]["mask"][()]
                bits = np.unpackbits(m.view(np.uint8).reshape(m.shape[0], -1), axis=1, bitorder="little")[:, :nt]
                layers.append(bits.astype(dtype))
            return layers
    except (OSError, KeyError, ValueError) as e:
        sys.exit("%s: %s: not a readable trace v1 (%s)" % (tool, path, e))
