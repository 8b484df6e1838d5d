#!/usr/bin/env python3
"""make_corpus.py - writes the small seed corpora of the fuzz targets into tests/fuzz/corpus/TARGET/.

Seeds are kept tiny (a few KB per target): libFuzzer grows its own corpus from them in the build
directory. Run from the repository root; rerunning rewrites the same files."""
import json, os, struct

ROOT = "tests/fuzz/corpus"

def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

# fuzz_api: first byte 1 = chat, 0 = completions
chat = {"model": "glm", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"}], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
        "stop": ["END"], "stop_token_ids": [3], "n": 2, "logprobs": True, "top_logprobs": 2, "stream": True,
        "stream_options": {"include_usage": True}, "logit_bias": {"5": -100, "7": 2.5}, "min_tokens": 2,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "auto",
        "chat_template_kwargs": {"enable_thinking": False}, "seed": 1}
put("fuzz_api", "chat", b"\x01" + json.dumps(chat).encode())
put("fuzz_api", "completions", b"\x00" + json.dumps({"prompt": ["a", [1, 2, 3]], "max_tokens": 3, "logprobs": 2, "echo": False, "n": 1}).encode())
put("fuzz_api", "bad", b"\x01" + b'{"messages":[{"role":"user","content":"x"}],"n":0,"response_format":{"type":"text"}}')

# fuzz_parsers: first byte = flags (force reasoning, format, no tools), then model output text
put("fuzz_parsers", "think_tool47", b"\x01" + "I should call it.</think>Sure.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>".encode())
put("fuzz_parsers", "tool45", b"\x02" + "<think>hmm</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>B\u00e9ziers</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{'a': [1, 2.5, None, True]}</arg_value>\n</tool_call>".encode())
put("fuzz_parsers", "partial", b"\x03" + b"answer <tool_call>f<arg_key>k</arg_key><arg_val")

# fuzz_sse: first byte seeds the chunking
put("fuzz_sse", "stream", b"\x07" + b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n: comment\r\ndata: x\r\ndata: y\r\n\r\nevent: e\nid: 1\ndata: [DONE]\n\n')
put("fuzz_sse", "cr", b"\x02" + b"data:a\rdata:b\r\rdata: last")

# fuzz_config
for n in ("glm-4.5-air.json", "glm-5.json"):
    put("fuzz_config", n.replace(".json", ""), open(os.path.join("configs", n), "rb").read())
put("fuzz_config", "nvfp4_decl", json.dumps({"producer": {"name": "modelopt", "version": "0.3"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head", "*mlp.gate", "model.layers.0*"]}}))
put("fuzz_config", "fp8_in_config", json.dumps({"model_type": "glm4_moe", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
    "head_dim": 16, "partial_rotary_factor": 0.5, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "topk_method": "noaux_tc",
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}}))

# fuzz_safetensors: first byte bit 0 = index.json, else the file itself
def st(tensors):
    hdr, data, off = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data
put("fuzz_safetensors", "file", b"\x00" + st([("a.weight", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                                                ("b", "BF16", [3], b"\x80\x3f" * 3), ("c", "F8_E4M3", [4], b"\x38" * 4),
                                                ("d", "U8", [0], b"")]))
put("fuzz_safetensors", "index", b"\x01" + json.dumps({"metadata": {"total_size": 40}, "weight_map": {"a.weight": "model-00001-of-00001.safetensors",
                                                        "b.bias": "model-00001-of-00001.safetensors"}}).encode())

# fuzz_tokenizer: tokenizer.json, NUL, tokenizer_config.json
bytes_chars = [c for c in "abcdefghijklmnopqrstuvwxyz !,.0123456789\u0120\u010a"]
vocab = {c: i for i, c in enumerate(bytes_chars)}
merges = ["h e", "l l", "he ll", "hell o", "\u0120 w", "o r"]
for m in merges:
    vocab[m.replace(" ", "")] = len(vocab)
tok = {"version": "1.0", "added_tokens": [{"id": 100, "content": "<think>", "special": True, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False},
                                          {"id": 101, "content": "</think>", "special": False, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}],
       "normalizer": {"type": "NFC"},
       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+|\\s+"}, "behavior": "Isolated", "invert": False},
                                                               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                 "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges}}
cfg = {"bos_token": None, "eos_token": "</think>", "add_bos_token": False, "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
put("fuzz_tokenizer", "tiny_bpe", json.dumps(tok).encode() + b"\x00" + json.dumps(cfg).encode())
put("fuzz_tokenizer", "tiny_bpe_nocfg", json.dumps(tok).encode())

# fuzz_template: template, NUL, messages JSON
put("fuzz_template", "glm5", open("configs/templates/glm5.jinja", "rb").read() + b"\x00" + json.dumps(chat["messages"]).encode())
put("fuzz_template", "features", b"{%- macro m(x, y=2) -%}{{ x ~ y }}{%- endmacro -%}{% set ns = namespace(n=0) %}{% for k, v in {'a': 1, 'b': [1,2]}|dictsort %}"
    b"{{ loop.index }}{{ k|upper }}{{ v|tojson }}{% if v is string %}s{% elif v is iterable %}{{ v|length }}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    b"{{ m(1) }}{{ ns.n }}{{ messages[-1].content|trim|replace('h','H') }}{{ range(3)|list }}{{ 'x'.startswith('x') }}{{ none is none }}"
    b"{% if add_generation_prompt %}<|assistant|>{% endif %}\x00" + json.dumps([{"role": "user", "content": " hi "}]).encode())
