#!/usr/bin/env python3
"""make_test_ckpt.py - writes a large sharded bf16 checkpoint of GLM-4.5-Air shapes (config from
configs/glm-4.5-air.json, cut to --layers decoder layers) for measuring how fast moeserve loads real
checkpoints (scripts/bench-load.sh). Standard library only. The weights are one small random block
of finite bf16 values repeated: the point is the bytes on disk, not the model.

usage: tools/make_test_ckpt.py OUT_DIR [--layers 2] [--shard-gb 2]
"""
import json
import os
import random
import struct
import sys


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    out = args[0]
    layers = int(args[args.index("--layers") + 1]) if "--layers" in args else 2
    shard_gb = float(args[args.index("--shard-gb") + 1]) if "--shard-gb" in args else 2.0
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = json.load(open(os.path.join(here, "..", "configs", "glm-4.5-air.json")))
    cfg["num_hidden_layers"] = layers
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    I, MI, E = cfg["intermediate_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]

    tensors = [("model.embed_tokens.weight", [V, H])]
    for L in range(layers):
        p = "model.layers.%d." % L
        tensors += [(p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H]),
                    (p + "self_attn.q_proj.weight", [nh * d, H]), (p + "self_attn.q_proj.bias", [nh * d]),
                    (p + "self_attn.k_proj.weight", [nkv * d, H]), (p + "self_attn.k_proj.bias", [nkv * d]),
                    (p + "self_attn.v_proj.weight", [nkv * d, H]), (p + "self_attn.v_proj.bias", [nkv * d]),
                    (p + "self_attn.o_proj.weight", [H, nh * d])]
        if L < cfg["first_k_dense_replace"]:
            tensors += [(p + "mlp.gate_proj.weight", [I, H]), (p + "mlp.up_proj.weight", [I, H]),
                        (p + "mlp.down_proj.weight", [H, I])]
        else:
            tensors += [(p + "mlp.gate.weight", [E, H]), (p + "mlp.gate.e_score_correction_bias", [E])]
            for e in range(E):
                q = p + "mlp.experts.%d." % e
                tensors += [(q + "gate_proj.weight", [MI, H]), (q + "up_proj.weight", [MI, H]),
                            (q + "down_proj.weight", [H, MI])]
            tensors += [(p + "mlp.shared_experts.gate_proj.weight", [MI, H]),
                        (p + "mlp.shared_experts.up_proj.weight", [MI, H]),
                        (p + "mlp.shared_experts.down_proj.weight", [H, MI])]
    tensors += [("model.norm.weight", [H]), ("lm_head.weight", [V, H])]

    rnd = random.Random(1)
    # finite bf16 values of magnitude ~0.01: sign, exponent 120 (2^-7), random mantissa
    block = b"".join(struct.pack("<H", (rnd.getrandbits(1) << 15) | (120 << 7) | rnd.getrandbits(7))
                     for _ in range(1 << 19))  # 1 MiB

    os.makedirs(out, exist_ok=True)
    limit = int(shard_gb * 1e9)
    shards, cur, size = [], [], 0
    for name, shape in tensors:
        n = 2
        for s in shape:
            n *= s
        if cur and size + n > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape, n))
        size += n
    shards.append(cur)
    weight_map = {}
    for i, sh in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        hdr, off = {}, 0
        for name, shape, n in sh:
            hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        hb = json.dumps(hdr).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(os.path.join(out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            left = off
            while left > 0:
                k = min(left, len(block))
                f.write(block[:k])
                left -= k
        print("wrote %s (%.2f GB)" % (fname, off / 1e9), flush=True)
    json.dump({"metadata": {"total_size": sum(n for sh in shards for _, _, n in sh)}, "weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"))
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
