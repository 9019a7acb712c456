import h5py, numpy as np

def read_layer(path, layer):
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "neuralink-trace" and f.attrs["version"] == 1
        n_tokens = int(f.attrs["n_tokens"])
        words = f[f"layers/{layer}/mask"][...]                  # uint64 [n_neurons][n_words]
    bytes_ = words.astype("<u8").view(np.uint8).reshape(words.shape[0], -1)
    bits = np.unpackbits(bytes_, axis=1, bitorder="little")  # LSB first, as stored
    return bits[:, :n_tokens].T.astype(bool)                  # [n_tokens][n_neurons]

import sys
m = read_layer(sys.argv[1], int(sys.argv[2]))
print(''.join('1' if x else '0' for x in m.ravel()))
