"""digest64, the digest both loaders check an artifact's parts by (`artifact/format.py`): the
NumPy implementation and the C one (`data/aot/digest64.h`) agree on every length, including a
last partial word and a last partial block, match values fixed here (so a change to either
is a format change, seen), and each alteration a damaged file can show changes it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tilefold.aot.c_abi import source_dir
from tilefold.artifact.format import BLOCK_WORDS, digest64, digest64_file

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "digest64.h"
int main(int argc, char **argv) {
  for (int a = 1; a < argc; a++) {
    FILE *f = fopen(argv[a], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) return 3;
    fclose(f);
    uint64_t serial = tf_digest64(p, (size_t)n), threaded = tf_digest64_threaded(p, (size_t)n, 3);
    if (threaded != serial) return 4;
    printf("%016llx\n", (unsigned long long)serial);
    free(p);
  }
  return 0;
}
"""

BLOCK = 8 * BLOCK_WORDS
LENGTHS = [0, 1, 7, 8, 9, 64, 1000, BLOCK - 1, BLOCK, BLOCK + 3, 2 * BLOCK + 8, 3 * BLOCK - 5]


@pytest.fixture(scope="module")
def c_digest(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("digest")
    (tmp / "digest.c").write_text(DRIVER)
    binary = tmp / "digest"
    subprocess.run([shutil.which("cc"), "-O2", f"-I{source_dir()}", str(tmp / "digest.c"),
                    "-o", str(binary), "-lpthread"], check=True)

    def run(blobs: list[bytes]) -> list[str]:
        files = []
        for i, blob in enumerate(blobs):
            files.append(tmp / f"blob{i}.bin")
            files[-1].write_bytes(blob)
        done = subprocess.run([str(binary), *map(str, files)], capture_output=True, text=True,
                              timeout=60, check=True)
        return done.stdout.split()

    return run


def _blob(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_numpy_and_c_agree_on_every_length(c_digest) -> None:
    """(And the C side's threaded digest gives its serial one: the driver checks.)"""
    blobs = [_blob(n, n) for n in [*LENGTHS, 12 * BLOCK + 5]]
    assert c_digest(blobs) == [digest64(b) for b in blobs]


def test_the_library_digest_the_loader_uses_agrees(tmp_path: Path) -> None:
    """tilefold.load digests data.bin with a checked library's `tf_digest64_parallel`, on
    threads of its own; a library that fails its check is not loaded for it (NumPy's then)."""
    import tilefold
    from tests.aot.graphs import GRAPHS, RNG_SEED, random_inputs
    from tilefold.artifact.format import DIGEST, MANIFEST, read_json
    from tilefold.artifact.load import _checked_library, _native_digest

    rng = np.random.default_rng(RNG_SEED)
    module = GRAPHS["mlp"](rng)
    path = tilefold.export(module, random_inputs(module, rng), tmp_path / "mlp.tfa")
    manifest = read_json(path / MANIFEST, "manifest")
    library = _checked_library(path, manifest)
    for threads in (1, 2, 3, 8):
        digest = _native_digest(library, threads)
        assert digest is not None
        for n in [0, 9, BLOCK, 4 * BLOCK + 3, 13 * BLOCK - 8, 20 * BLOCK + 1]:
            blob = _blob(n, n)
            assert digest(blob) == digest64(blob), (n, threads)
            assert digest(np.frombuffer(blob, np.uint8)) == digest64(blob), (n, threads)
    blob = _blob(3 * BLOCK - 13, 1)
    for name, altered in _alterations(blob).items():
        assert digest(altered) != digest64(blob), name
    manifest["parts"]["library"][DIGEST] = "0" * 16
    assert _checked_library(path, manifest) is None and _native_digest(None, 2) is None


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_threads_split_the_blocks_not_the_digest(threads: int) -> None:
    for n in [0, 9, BLOCK, 4 * BLOCK + 3, 13 * BLOCK - 8, 20 * BLOCK + 1]:
        blob = _blob(n, n)
        assert digest64(blob, threads) == digest64(blob), n


def test_the_digest_is_fixed(tmp_path: Path) -> None:
    """Values written down once: a change here is a change of the artifact format."""
    assert digest64(b"") == "6e968c0d22dc70b8"
    assert digest64(b"a") == "bce9500f30d1c001"
    assert digest64(bytes(range(100))) == "80c526604a1706de"
    (tmp_path / "f").write_bytes(bytes(range(100)))
    assert digest64_file(tmp_path / "f") == "80c526604a1706de"
    assert digest64(np.frombuffer(bytes(range(100)), np.uint8)) == "80c526604a1706de"


def _alterations(blob: bytes) -> dict[str, bytes]:
    n, word = len(blob), 8
    out = {}
    for name, at in [("first", 0), ("middle", n // 2), ("block-edge", BLOCK - 1),
                     ("second-block", BLOCK), ("near-end", n - 9), ("last", n - 1)]:
        for bit in (0x01, 0x80):
            b = bytearray(blob)
            b[at] ^= bit
            out[f"flip-{name}-{bit:#x}"] = bytes(b)
    b = bytearray(blob)  # two words of one block swapped
    b[0:word], b[5 * word:6 * word] = blob[5 * word:6 * word], blob[0:word]
    out["swap-words"] = bytes(b)
    out["swap-blocks"] = blob[BLOCK:2 * BLOCK] + blob[:BLOCK] + blob[2 * BLOCK:]
    out["zeroed-block"] = bytes(BLOCK) + blob[BLOCK:]
    out["dropped-last-byte"] = blob[:-1]
    out["zero-appended"] = blob + b"\0"
    b = bytearray(blob)  # the top bits of two words: what a plain sum of products loses
    b[7] ^= 0x80
    b[15] ^= 0x80
    out["two-top-bits"] = bytes(b)
    return out


def test_every_alteration_changes_the_digest_in_both(c_digest) -> None:
    blob = _blob(3 * BLOCK - 13, 1)
    altered = _alterations(blob)
    assert all(a != blob for a in altered.values())
    want = digest64(blob)
    python = {name: digest64(a) for name, a in altered.items()}
    assert [name for name, d in python.items() if d == want] == []
    assert c_digest([blob, *altered.values()]) == [want, *python.values()]
