"""An independent reading of docs/fingerprint.md (format 1), written from the
page alone, that recomputes every committed test vector.

The product's tests check the vectors against its own spec header
(cuda/src/fingerprint_spec.h): a mistake shared by the header and the
kernels would pass them. This file shares no code with either, so the page,
the vectors and the product must all agree for it to pass.

    fingerprint_reference.py VECTORS_FILE

Prints one line per mismatch and exits 1 if there is any (or no vector).
Python stdlib only. Sums are kept as unbounded ints and reduced mod 2^64
once per tensor: addition mod 2^64 commutes with the reduction.
"""
import struct
import sys

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
G = 0x9E3779B97F4A7C15

# idl/common.fbs `enum DType` numbering (the page's "dtype number") and each
# element's size in bytes, under the names the vectors file uses.
DTYPES = {
    "float64": (1, 8), "float32": (2, 4), "float16": (3, 2), "bfloat16": (4, 2),
    "float8_e4m3fn": (5, 1), "float8_e5m2": (6, 1),
    "int64": (7, 8), "int32": (8, 4), "int16": (9, 2), "int8": (10, 1), "uint8": (11, 1),
    "bool": (12, 1), "uint16": (13, 2), "uint32": (14, 4), "uint64": (15, 8),
    "complex64": (16, 8), "complex128": (17, 16),
}


def mix64(z):
    z ^= z >> 27
    z = (z * 0x3C79AC492BA7B653) & M64
    z ^= z >> 33
    z = (z * 0x1C69B3F74AC4AE35) & M64
    return z ^ (z >> 27)


TABLE_A = [mix64((0x243F6A8885A308D3 + i * G) & M64) for i in range(256)]
TABLE_B = [mix64((0x13198A2E03707344 + i * G) & M64) for i in range(256)]


def block_key_a(b):
    return mix64((0xA4093822299F31D0 + b * G) & M64)


def block_key_b(b):
    return mix64(0x082EFA98EC4E6C89 ^ ((b * G) & M64))


class Keys:
    """Per-position keys (TableKey(i) + BlockKey(b)) for positions 0..n-1,
    grown on demand and shared by every vector."""

    def __init__(self):
        self.a, self.b = [], []

    def upto(self, n):
        while len(self.a) < n:
            blk = len(self.a) // 256
            ka, kb = block_key_a(blk), block_key_b(blk)
            self.a.extend((t + ka) & M64 for t in TABLE_A)
            self.b.extend((t + kb) & M64 for t in TABLE_B)
        return self.a, self.b


KEYS = Keys()


def lane_sums(words):
    ka, kb = KEYS.upto(len(words))
    # a0 += lo32(x)*hi32(x) + swap32(w);  a1 += lo32(y)*hi32(y) + w
    prod_a = sum((x & M32) * (x >> 32) for x in map(int.__xor__, words, ka))
    prod_b = sum((y & M32) * (y >> 32) for y in map(int.__xor__, words, kb))
    swap = sum(((w & M32) << 32) | (w >> 32) for w in words)
    return (prod_a + swap) & M64, (prod_b + sum(words)) & M64


def absorb(m, v):
    lo = mix64(m[0] ^ v)
    return lo, mix64((m[1] + v + lo) & M64)


def digest(data, dtype_number, shape):
    """128-bit digest of `data` (the logical byte stream) as 32 hex digits."""
    length = len(data)
    padded = data + bytes(-length % 8)
    words = list(struct.unpack(f"<{len(padded) // 8}Q", padded))
    a0, a1 = lane_sums(words)
    m = (0x452821E638D01377, 0xBE5466CF34E90C6C)
    for v in (dtype_number, length, len(shape), *shape):
        m = absorb(m, v & M64)
    x = (a0 + m[0]) & M64
    y = (a1 + m[1]) & M64
    x = mix64(x)
    y = mix64(y ^ x)
    x = mix64(x ^ y)
    y = mix64((y + x) & M64)
    return (x.to_bytes(8, "little") + y.to_bytes(8, "little")).hex()


def splitmix64_bytes(seed, n):
    """The first n bytes of the SplitMix64 stream started at state `seed`."""
    out = []
    state = seed & M64
    for _ in range((n + 7) // 8):
        state = (state + G) & M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        out.append(z ^ (z >> 31))
    return struct.pack(f"<{len(out)}Q", *out)[:n]


def check(path):
    checked, failures = 0, []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            seed, dtype, shape_text, expected = line.split()
            number, size = DTYPES[dtype]
            shape = [] if shape_text == "-" else [int(d) for d in shape_text.split(",")]
            numel = 1
            for d in shape:
                numel *= d
            got = digest(splitmix64_bytes(int(seed), numel * size), number, shape)
            checked += 1
            if got != expected:
                failures.append(f"{path}:{lineno}: {dtype} {shape_text} seed {seed}: "
                                f"vectors say {expected}, the page gives {got}")
    return checked, failures


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: fingerprint_reference.py VECTORS_FILE")
    checked, failures = check(argv[1])
    for f in failures:
        print(f)
    print(f"{checked - len(failures)} passed, {len(failures)} failed")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
