#!/usr/bin/env python3
"""make_fixtures.py - writes the model conformance fixtures into tests/fixtures/.

Runs where PyTorch and transformers (5.17) are installed (the GPU machine; CPU float32 is used for
the reference so results do not depend on TF32 or kernel choice). For each fixture it builds a tiny
random model of one architecture with O(1)-scaled weights (not the 0.02 init, which hides errors),
non-zero e_score_correction_bias, index_topk smaller than the test sequence, legacy or v5 config keys,
grouped or ungrouped routing; saves the checkpoint in BF16; computes float32 reference logits of
every position and a greedy continuation (full recompute each step, no KV cache, so the reference
does not depend on transformers' cache code). Quantized variants (FP8 block 128x128 and ModelOpt
NVFP4) are produced with exactly the format definitions of reference/glm5-spec.md section 4, the
same bytes `moeserve quantize` must write (tests/model checks that), and their reference is
transformers run on the dequantized weights.

Each fixture directory holds the checkpoint plus ref.json:
  {"ids": [...], "logits_file": "logits.f32", "vocab": V, "tol": 1e-4,
   "greedy_prompt": [...], "greedy_ids": [...], "greedy_min_gap": g, "arch": ..., "format": ...}
Usage: python3 tools/make_fixtures.py OUT_DIR
"""
import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers import AutoModelForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

SEQ = 20
GEN = 8


def log(*a):
    print(*a, flush=True)


def init_weights(model, seed):
    """O(1)-scaled random weights, every value bf16-representable (checkpoints are bf16)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1]
                std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(fan_in)
                v = torch.randn(p.shape, generator=g) * std
            elif name.endswith("bias"):
                v = torch.randn(p.shape, generator=g) * 0.3
            else:  # norm weights
                v = 1.0 + torch.randn(p.shape, generator=g) * 0.2
            p.copy_(v.to(torch.bfloat16).to(p.dtype))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                v = torch.randn(b.shape, generator=g) * 0.3
                b.copy_(v.to(torch.bfloat16).to(b.dtype))


def ref_logits(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].float()


def greedy(model, prompt, n):
    seq = list(prompt)
    gaps = []
    for _ in range(n):
        lg = ref_logits(model, seq)[-1]
        top = torch.topk(lg, 2)
        gaps.append(float(top.values[0] - top.values[1]))
        seq.append(int(top.indices[0]))
    return seq[len(prompt):], min(gaps)


def write_ref(d, model, cfg, ids, fmt, arch, tol):
    lg = ref_logits(model, ids)
    lg.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))
    gp = ids[:10]
    gids, gap = greedy(model, gp, GEN)
    ref = {"ids": ids, "logits_file": "logits.f32", "vocab": cfg.vocab_size, "tol": tol,
           "greedy_prompt": gp, "greedy_ids": gids, "greedy_min_gap": gap, "arch": arch, "format": fmt,
           "transformers": transformers.__version__, "torch": torch.__version__}
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    log(f"  {os.path.basename(d)}: logits {tuple(lg.shape)} greedy {gids} min top-2 gap {gap:.4f}")


# ---------------------------------------------------------------- quantization (spec section 4)

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def f32_to_e2m1(x):
    """Nearest E2M1 code (ties to the even code), saturating at 6; sign bit from signbit (so -0 -> 8)."""
    a = x.abs()
    lo = torch.searchsorted(E2M1, a.contiguous(), right=True) - 1  # index with E2M1[lo] <= a
    lo = lo.clamp(0, 7)
    hi = (lo + 1).clamp(max=7)
    dl = a - E2M1[lo]
    dh = E2M1[hi] - a
    pick_hi = (dh < dl) | ((dh == dl) & (lo % 2 == 1))
    code = torch.where((lo < 7) & pick_hi, hi, lo)
    code = torch.where(a >= 6.0, torch.full_like(code, 7), code)
    sign = torch.signbit(x).to(code.dtype) * 8
    return (code + sign).to(torch.uint8)


def quant_nvfp4(W):
    """W [N,K] float32 -> (packed u8 [N,K/2], scale e4m3 [N,K/16], scale2 f32, dequantized f32)."""
    N, K = W.shape
    assert K % 16 == 0
    amax = W.abs().max().float()
    scale2 = (amax / (6.0 * 448.0)).float()
    blk = W.reshape(N, K // 16, 16)
    bamax = blk.abs().amax(dim=2)
    bs = (bamax / (6.0 * scale2)).clamp(max=448.0).to(torch.float8_e4m3fn)
    bsf = bs.float()
    den = (bsf * scale2).unsqueeze(2)
    q = torch.where(den > 0, blk / den, torch.zeros_like(blk))
    codes = f32_to_e2m1(q).reshape(N, K)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    vals = E2M1[(codes & 7).long()] * torch.where((codes & 8) > 0, -1.0, 1.0)
    deq = (vals.reshape(N, K // 16, 16) * (bsf * scale2).unsqueeze(2)).reshape(N, K)
    return packed, bs, scale2, deq


def quant_fp8(W):
    """W [N,K] -> (e4m3 [N,K], scale_inv f32 [ceil(N/128), ceil(K/128)], dequantized f32)."""
    N, K = W.shape
    nb, kb = (N + 127) // 128, (K + 127) // 128
    s = torch.zeros(nb, kb)
    q = torch.zeros(N, K, dtype=torch.float8_e4m3fn)
    deq = torch.zeros(N, K)
    for i in range(nb):
        for j in range(kb):
            blk = W[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = blk.abs().max().float()
            sc = (amax / 448.0).float() if amax > 0 else torch.tensor(1.0)
            s[i, j] = sc
            qb = (blk / sc).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = qb
            deq[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = qb.float() * sc
    return q, s, deq


def is_quant_target(name, fmt):
    """Default policy of `moeserve quantize`: experts (routed + shared) and dense MLP for nvfp4; those
    plus attention projections for fp8. Embeddings, lm_head, norms, router and indexer stay."""
    if not name.endswith(".weight"):
        return False
    if ".mlp.experts." in name or ".mlp.shared_experts." in name:
        return True
    if any(name.endswith(f".mlp.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj")):
        return True
    if fmt == "fp8" and ".self_attn." in name and ".indexer." not in name:
        return any(name.endswith(f".{p}.weight") for p in
                   ("q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                    "kv_b_proj"))
    return False


def quantize_dir(src, dst, fmt, model_cls, cfg):
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith(".json") and f not in ("ref.json", "model.safetensors.index.json"):
            shutil.copy(os.path.join(src, f), dst)
    sd = load_file(os.path.join(src, "model.safetensors"))
    out, deq_sd = {}, {}
    for name, t in sd.items():
        if t.dim() == 2 and is_quant_target(name, fmt):
            W = t.float()
            base = name[:-len(".weight")]
            if fmt == "nvfp4":
                packed, bs, s2, deq = quant_nvfp4(W)
                out[name] = packed
                out[base + ".weight_scale"] = bs
                out[base + ".weight_scale_2"] = s2.reshape(())
                out[base + ".input_scale"] = torch.tensor(1.0 / 448.0).reshape(())
            else:
                q, s, deq = quant_fp8(W)
                out[name] = q
                out[base + ".weight_scale_inv"] = s
            deq_sd[name] = deq
        else:
            out[name] = t
            deq_sd[name] = t.float()
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    conf = json.load(open(os.path.join(dst, "config.json")))
    if fmt == "nvfp4":
        excl = ["lm_head", "model.embed_tokens", "*.mlp.gate", "*self_attn*"]
        hq = {"producer": {"name": "modelopt", "version": "0.0.0-moeserve-fixture"},
              "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                               "exclude_modules": excl}}
        json.dump(hq, open(os.path.join(dst, "hf_quant_config.json"), "w"), indent=1)
        conf["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                       "kv_cache_quant_algo": None, "ignore": excl}
    else:
        conf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                       "weight_block_size": [128, 128],
                                       "modules_to_not_convert": ["lm_head", "model.embed_tokens", "*.mlp.gate",
                                                                  "*.indexer*"]}
    json.dump(conf, open(os.path.join(dst, "config.json"), "w"), indent=1)
    # reference: transformers on the dequantized weights, loaded from disk like any checkpoint
    tmp = dst + ".deq"
    os.makedirs(tmp, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith(".json") and f != "ref.json":
            shutil.copy(os.path.join(src, f), tmp)
    save_file({k: v.contiguous() for k, v in deq_sd.items()}, os.path.join(tmp, "model.safetensors"),
              metadata={"format": "pt"})
    model = load_ref(model_cls, tmp)
    shutil.rmtree(tmp)
    return model


def load_ref(cls, d):
    try:
        m = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        m = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
    return m.float().eval()


def try_config(cls, kw):
    """Builds a config, dropping keys this transformers version rejects (logged)."""
    kw = dict(kw)
    for _ in range(10):
        try:
            return cls(**kw)
        except TypeError as e:
            msg = str(e)
            bad = [k for k in kw if f"'{k}'" in msg]
            if not bad:
                raise
            log("  config: dropping unsupported key", bad)
            for k in bad:
                kw.pop(k)
    raise RuntimeError("config construction failed")


def save_bf16(model, d, fused=False):
    m16 = model.to(torch.bfloat16)
    try:
        m16.save_pretrained(d, safe_serialization=True, **({"save_original_format": False} if fused else {}))
    except TypeError:
        m16.save_pretrained(d, safe_serialization=True)
    model.float()
    files = sorted(os.listdir(d))
    log("  saved", files)


def legacy_keys(d, partial):
    """Rewrites config.json with pre-v5 keys: rope_theta (+partial_rotary_factor), torch_dtype."""
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    rp = c.pop("rope_parameters", None) or {}
    c["rope_theta"] = rp.get("rope_theta", 10000.0)
    if partial is not None:
        c["partial_rotary_factor"] = rp.get("partial_rotary_factor", partial)
    c["rope_scaling"] = None
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    json.dump(c, open(p, "w"), indent=1)


def glm4_cfg(grouped, qk_norm, legacy):
    from transformers import Glm4MoeConfig
    kw = dict(vocab_size=384, hidden_size=144, intermediate_size=160, moe_intermediate_size=48,
              num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=32,
              use_qk_norm=qk_norm, attention_bias=True, n_routed_experts=8, n_shared_experts=1,
              num_experts_per_tok=3, first_k_dense_replace=1, n_group=4 if grouped else 1,
              topk_group=2 if grouped else 1, routed_scaling_factor=2.5, norm_topk_prob=True,
              rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
              partial_rotary_factor=0.5, eos_token_id=[1, 2], bos_token_id=0, pad_token_id=1)
    return try_config(Glm4MoeConfig, kw)


def dsa_cfg(grouped, indexer_types, legacy):
    from transformers import GlmMoeDsaConfig
    kw = dict(vocab_size=384, hidden_size=144, intermediate_size=160, moe_intermediate_size=48,
              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=96,
              kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
              n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, first_k_dense_replace=1,
              n_group=4 if grouped else 1, topk_group=2 if grouped else 1, routed_scaling_factor=2.5,
              norm_topk_prob=True, rms_norm_eps=1e-6, max_position_embeddings=256,
              tie_word_embeddings=False, index_topk=5, index_n_heads=8, index_head_dim=32,
              indexer_types=indexer_types,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
              eos_token_id=[1, 2], bos_token_id=0, pad_token_id=1)
    return try_config(GlmMoeDsaConfig, kw)


# ---------------------------------------------------------------- MTP (NEXTN) fixtures (issue 16)
# tests/fixtures/<arch>_mtp: a small model (kept under 1 MB) whose checkpoint also holds a random MTP
# layer at index L = num_hidden_layers, with the reference of the MTP forward as SGLang's
# glm4_moe_nextn / deepseek_nextn define it:
#   x = eh_proj([enorm(embed(ids[t+1])) ; hnorm(h[t])]),  h = the main model's last_hidden_state
#       (after the final norm: what the lm_head reads)
#   h' = decoder_layer_L(x) over positions 0..S-2 (causal), logits = shared_head.head(shared_head.norm(h'))
# The decoder layer is transformers' own class (built at index L of a config one layer longer);
# enorm / hnorm / eh_proj / shared_head are plain torch. ref.json gets an "mtp" object:
#   {"ids": [...], "n": S-1, "hidden": H, "hidden_file": "mtp_hidden.f32" ([n, H] h[0..n)),
#    "logits_file": "mtp_logits.f32" ([n, V]), "tol": 1e-4}
# next to the usual main-model reference (the conformance test checks the main model there too).


def mtp_small_cfg(arch):
    if arch == "glm4_moe":
        from transformers import Glm4MoeConfig
        kw = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  use_qk_norm=True, attention_bias=True, n_routed_experts=8, n_shared_experts=1,
                  num_experts_per_tok=3, first_k_dense_replace=1, n_group=4, topk_group=2,
                  routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6,
                  max_position_embeddings=256, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                  partial_rotary_factor=0.5, num_nextn_predict_layers=1, eos_token_id=[1, 2], bos_token_id=0,
                  pad_token_id=1)
        return try_config(Glm4MoeConfig, kw)
    from transformers import GlmMoeDsaConfig
    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48,
              kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
              n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, first_k_dense_replace=1,
              n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6,
              max_position_embeddings=256, tie_word_embeddings=False, index_topk=5, index_n_heads=4,
              index_head_dim=16, indexer_types=["full", "shared"], num_nextn_predict_layers=1,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
              eos_token_id=[1, 2], bos_token_id=0, pad_token_id=1)
    return try_config(GlmMoeDsaConfig, kw)


def mtp_layer_config(cfg):
    """cfg one layer longer: the per-layer lists transformers' decoder-layer classes index by their own
    layer number get an entry for the MTP layer (a MoE layer; its DSA indexer is a full one). Built as a
    new config from cfg's dict (a config may validate list lengths against num_hidden_layers)."""
    import copy
    L = cfg.num_hidden_layers
    d = cfg.to_dict()
    for key, extra in (("mlp_layer_types", "sparse"), ("indexer_types", "full"), ("layer_types", None)):
        v = d.get(key)
        if isinstance(v, list) and len(v) == L:
            d[key] = list(v) + [extra if extra is not None else v[-1]]
    d["num_hidden_layers"] = L + 1
    try:
        c2 = type(cfg)(**d)
    except Exception as e:  # fall back to editing a copy in place
        log("  mtp: config rebuild failed (", e, "); editing a copy")
        c2 = copy.deepcopy(cfg)
        for key in ("mlp_layer_types", "indexer_types", "layer_types"):
            if key in d and hasattr(c2, key):
                setattr(c2, key, d[key])
        c2.num_hidden_layers = L + 1
    c2._attn_implementation = "eager"
    return c2


def mtp_rms(x, w, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def mtp_layer_tensors(layer, L):
    """The decoder layer's parameters and buffers under checkpoint names model.layers.L.*, routed
    experts split per expert (the layout save_pretrained writes for the main layers)."""
    out = {}
    sd = dict(layer.state_dict())
    for name, t in sd.items():
        if not (name.endswith("weight") or name.endswith("bias") or name.endswith("gate_up_proj")
                or name.endswith("down_proj") or "e_score_correction_bias" in name):
            continue
        if name.endswith("mlp.experts.gate_up_proj") and t.dim() == 3:
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"model.layers.{L}.mlp.experts.{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"model.layers.{L}.mlp.experts.{e}.up_proj.weight"] = t[e, inter:].clone()
            continue
        if name.endswith("mlp.experts.down_proj") and t.dim() == 3:
            for e in range(t.shape[0]):
                out[f"model.layers.{L}.mlp.experts.{e}.down_proj.weight"] = t[e].clone()
            continue
        out[f"model.layers.{L}.{name}"] = t.clone()
    return out


def make_mtp_fixture(out, arch, cls, seed, ids):
    log(f"fixture {arch}_mtp")
    cfg = mtp_small_cfg(arch)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    init_weights(model, seed)
    d = os.path.join(out, f"{arch}_mtp")
    if os.path.exists(d):
        shutil.rmtree(d)
    save_bf16(model, d)
    ref = load_ref(cls, d)
    L, H, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    eps = cfg.rms_norm_eps
    # the MTP layer: transformers' decoder-layer class, O(1)-scaled random weights
    c2 = mtp_layer_config(cfg)
    layer_cls = type(ref.model.layers[-1])
    layer = layer_cls(c2, L).float().eval()
    init_weights(layer, seed + 100)
    g = torch.Generator().manual_seed(seed + 200)

    def bf(shape, std=None, norm=False):
        v = (1.0 + torch.randn(shape, generator=g) * 0.2) if norm else torch.randn(shape, generator=g) * std
        return v.to(torch.bfloat16).float()

    enorm, hnorm, shnorm = bf((H,), norm=True), bf((H,), norm=True), bf((H,), norm=True)
    eh = bf((H, 2 * H), std=1.0 / math.sqrt(2 * H))
    head = bf((V, H), std=1.0 / math.sqrt(H))
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in mtp_layer_tensors(layer, L).items()}
    for k in list(tensors):
        if "e_score_correction_bias" in k:
            tensors[k] = tensors[k].float().contiguous()
    tensors.update({f"model.layers.{L}.enorm.weight": enorm, f"model.layers.{L}.hnorm.weight": hnorm,
                    f"model.layers.{L}.eh_proj.weight": eh, f"model.layers.{L}.shared_head.norm.weight": shnorm,
                    f"model.layers.{L}.shared_head.head.weight": head})
    st = os.path.join(d, "model.safetensors")
    sd = load_file(st)
    sd.update({k: v.to(torch.bfloat16).contiguous() if v.dtype != torch.float32 or "e_score" not in k else v
               for k, v in tensors.items()})
    save_file(sd, st, metadata={"format": "pt"})
    conf = json.load(open(os.path.join(d, "config.json")))
    conf["num_nextn_predict_layers"] = 1
    json.dump(conf, open(os.path.join(d, "config.json"), "w"), indent=1)
    write_ref(d, ref, cfg, ids, "bf16", arch, 1e-4)
    # the reference of the MTP forward
    S = len(ids)
    n = S - 1
    with torch.no_grad():
        tid = torch.tensor([ids])
        h = ref.model(tid, use_cache=False).last_hidden_state[0].float()  # after the final norm
        e = ref.model.embed_tokens(tid[:, 1:])[0].float()
        x = torch.cat([mtp_rms(e, enorm, eps), mtp_rms(h[:n], hnorm, eps)], dim=-1) @ eh.t()
        pos = torch.arange(n)[None]
        cos, sin = ref.model.rotary_emb(x[None], pos)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        y = layer(x[None], attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin), use_cache=False)
        if isinstance(y, tuple):
            y = y[0]
        logits = mtp_rms(y[0], shnorm, eps) @ head.t()
    h[:n].numpy().astype("<f4").tofile(os.path.join(d, "mtp_hidden.f32"))
    logits.numpy().astype("<f4").tofile(os.path.join(d, "mtp_logits.f32"))
    rp = os.path.join(d, "ref.json")
    r = json.load(open(rp))
    r["mtp"] = {"ids": ids, "n": n, "hidden": H, "hidden_file": "mtp_hidden.f32", "logits_file": "mtp_logits.f32",
                "tol": 1e-4, "layer": L}
    json.dump(r, open(rp, "w"), indent=1)
    top = torch.topk(logits, 2, dim=-1).values
    log(f"  {arch}_mtp: MTP logits {tuple(logits.shape)}, min top-2 gap {float((top[:, 0] - top[:, 1]).min()):.4f}, "
        f"files {sorted(os.listdir(d))}")


def make_mtp_fixtures(out, ids):
    from transformers import Glm4MoeForCausalLM, GlmMoeDsaForCausalLM
    small = [i % 256 if i % 256 >= 3 else i + 3 for i in ids]
    make_mtp_fixture(out, "glm4_moe", Glm4MoeForCausalLM, 21, small)
    make_mtp_fixture(out, "glm_moe_dsa", GlmMoeDsaForCausalLM, 23, small)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    os.makedirs(out, exist_ok=True)
    log("transformers", transformers.__version__, "torch", torch.__version__)
    from transformers import Glm4MoeForCausalLM, GlmMoeDsaForCausalLM
    import inspect
    dump = os.environ.get("OUT")
    if dump:  # the installed modeling code, to read what this transformers version computes
        for c in (GlmMoeDsaForCausalLM, Glm4MoeForCausalLM):
            shutil.copy(inspect.getsourcefile(c), dump)
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(3, 384, (SEQ,), generator=g).tolist()

    specs = [
        # name, arch, cfg builder, model cls, seed, legacy, fused, quantized variants
        ("glm4_moe", "glm4_moe", lambda: glm4_cfg(True, True, False), Glm4MoeForCausalLM, 11, False, False, ["nvfp4", "fp8"]),
        ("glm4_moe_legacy", "glm4_moe", lambda: glm4_cfg(False, False, True), Glm4MoeForCausalLM, 12, True, True, []),
        ("glm_moe_dsa", "glm_moe_dsa", lambda: dsa_cfg(False, ["full", "shared", "full", "shared"], False),
         GlmMoeDsaForCausalLM, 13, False, False, ["nvfp4", "fp8"]),
        ("glm_moe_dsa_legacy", "glm_moe_dsa", lambda: dsa_cfg(True, None, True), GlmMoeDsaForCausalLM, 14, True, True, []),
    ]
    for name, arch, mk, cls, seed, legacy, fused, quants in specs:
        log(f"fixture {name}")
        cfg = mk()
        cfg._attn_implementation = "eager"
        torch.manual_seed(seed)
        model = cls(cfg).float().eval()
        init_weights(model, seed)
        d = os.path.join(out, name)
        if os.path.exists(d):
            shutil.rmtree(d)
        save_bf16(model, d, fused=fused)
        ref = load_ref(cls, d)  # the reference reads the very checkpoint the test loads
        sd_ref = ref.state_dict()
        diff = [n for n, p in model.state_dict().items()
                if n not in sd_ref or not torch.equal(p.float(), sd_ref[n].float())]
        if diff:
            log("  WARNING: reloaded checkpoint differs from the in-memory model in", diff[:8])
        write_ref(d, ref, cfg, ids, "bf16", arch, 1e-4)
        if legacy:
            legacy_keys(d, 0.5 if arch == "glm4_moe" else None)
        for q in quants:
            qd = os.path.join(out, f"{name}_{q}")
            if os.path.exists(qd):
                shutil.rmtree(qd)
            qm = quantize_dir(d, qd, q, cls, cfg)
            write_ref(qd, qm, cfg, ids, q, arch, 1e-4)
    make_mtp_fixtures(out, ids)
    log("done")


if __name__ == "__main__":
    main()
