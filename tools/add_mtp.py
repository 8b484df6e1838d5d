#!/usr/bin/env python3
"""add_mtp.py - gives a test checkpoint an MTP (NEXTN) layer of random weights, with the standard library only.

Speculative decoding needs a checkpoint with the multi-token-prediction layer GLM-4.5+/GLM-5 ship
(model.layers.L.{enorm,hnorm,eh_proj,shared_head.norm,shared_head.head} plus a full decoder layer,
L = num_hidden_layers). The committed fixtures (tests/fixtures/glm4_moe, glm_moe_dsa) have none, and
PyTorch is not on every machine, so the engine tests make one at test time: this copies SRC to DST and
appends to DST/model.safetensors (u64 header length, JSON header, raw bytes) a layer L whose tensors
have the names, shapes and dtypes of the source's fullest decoder layer (the MoE layer with the most
tensors, e.g. the one with a DSA indexer), filled with seeded O(1)-scaled bf16 values, and sets
num_nextn_predict_layers = 1 in config.json. Random MTP weights make a poor draft (low acceptance):
the tests that need acceptance use the engine's draft hooks instead.

Usage: python3 tools/add_mtp.py SRC_DIR DST_DIR [--seed N] [--no-head] [--replace]
  --no-head  leave out shared_head.head (the engine then uses the main lm_head)
  --replace  a checkpoint that already has an MTP layer (the demo model) gets a random one instead
             (the engine tests that need drafts mostly rejected, i.e. rollback on every step)
"""
import json
import math
import os
import random
import re
import shutil
import struct
import sys


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def bf16_bytes(values):
    """Packs floats as bf16 (round to nearest even), little-endian."""
    out = bytearray(2 * len(values))
    for i, v in enumerate(values):
        u = struct.unpack("<I", struct.pack("<f", v))[0]
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        struct.pack_into("<H", out, 2 * i, u & 0xFFFF)
    return bytes(out)


def random_values(rng, name, shape):
    n = 1
    for s in shape:
        n *= s
    if len(shape) >= 2:  # weight: variance 1/fan_in, so activations stay O(1)
        std = 1.0 / math.sqrt(shape[-1])
        return [rng.gauss(0.0, std) for _ in range(n)]
    if name.endswith("bias"):
        return [rng.gauss(0.0, 0.3) for _ in range(n)]
    return [1.0 + rng.gauss(0.0, 0.2) for _ in range(n)]  # norm weights


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    seed = 7
    if "--seed" in argv:
        seed = int(argv[argv.index("--seed") + 1])
        args.remove(str(seed))
    no_head = "--no-head" in argv
    replace = "--replace" in argv
    if len(args) != 2:
        sys.stderr.write(__doc__)
        return 2
    src, dst = args
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != "model.safetensors" and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)
    cfg = json.load(open(os.path.join(src, "config.json")))
    L = cfg["num_hidden_layers"]
    H = cfg["hidden_size"]
    V = cfg["vocab_size"]
    header, data = read_st(os.path.join(src, "model.safetensors"))
    meta = header.pop("__metadata__", None)

    # the fullest MoE layer is the template (last one on ties)
    per_layer = {}
    for name in header:
        m = re.match(r"model\.layers\.(\d+)\.(.*)$", name)
        if m:
            per_layer.setdefault(int(m.group(1)), []).append(m.group(2))
    if any(k >= L for k in per_layer):
        if not replace:
            sys.stderr.write(f"{src}: the checkpoint already has tensors of layer {L} or later (--replace)\n")
            return 1
        # drop them: the kept tensors are packed again from offset 0
        kept, parts, off = {}, [], 0
        for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            m = re.match(r"model\.layers\.(\d+)\.", name)
            if m and int(m.group(1)) >= L:
                continue
            a, b = t["data_offsets"]
            kept[name] = dict(t, data_offsets=[off, off + b - a])
            parts.append(data[a:b])
            off += b - a
        header, data = kept, b"".join(parts)
        per_layer = {k: v for k, v in per_layer.items() if k < L}
    moe = [k for k, v in per_layer.items() if "mlp.gate.weight" in v] or list(per_layer)
    tmpl = max(moe, key=lambda k: (len(per_layer[k]), k))

    new = []  # (name, dtype, shape)
    for suffix in sorted(per_layer[tmpl]):
        t = header[f"model.layers.{tmpl}.{suffix}"]
        new.append((f"model.layers.{L}.{suffix}", t["dtype"], t["shape"]))
    new += [(f"model.layers.{L}.enorm.weight", "BF16", [H]), (f"model.layers.{L}.hnorm.weight", "BF16", [H]),
            (f"model.layers.{L}.eh_proj.weight", "BF16", [H, 2 * H]),
            (f"model.layers.{L}.shared_head.norm.weight", "BF16", [H])]
    if not no_head:
        new.append((f"model.layers.{L}.shared_head.head.weight", "BF16", [V, H]))

    rng = random.Random(seed)
    blobs = [data]
    off = len(data)
    for name, dtype, shape in new:
        vals = random_values(rng, name, shape)
        if dtype == "BF16":
            b = bf16_bytes(vals)
        elif dtype == "F32":
            b = struct.pack(f"<{len(vals)}f", *vals)
        else:
            sys.stderr.write(f"{src}: template tensor for '{name}' has dtype {dtype} (only BF16/F32 copied)\n")
            return 1
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta is not None:
        header["__metadata__"] = meta
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    cfg["num_nextn_predict_layers"] = 1
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=1)
    print(f"{dst}: MTP layer {L} ({len(new)} tensors, template layer {tmpl}{', no shared_head.head' if no_head else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
