#!/usr/bin/env python3
"""train_demo.py - trains the built-in demo model (models/demo) from scratch.

A small glm4_moe model (MoE layers with a shared expert and noaux_tc routing, so serving it exercises
the real MoE path) plus a byte-level BPE tokenizer with GLM's special tokens and the GLM-5-style chat
template (configs/templates/glm5.jinja). All training text is generated here, seeded:
  - arithmetic questions in varied phrasings (a+b and a-b with integers up to 999, a×b with a of up
    to two digits and b one digit), answered with column-by-column working inside the reasoning and
    then "A + B = C" as the content; the same without the working when enable_thinking is false;
  - greetings and a short self-description;
  - tool use: with a `calculator` tool offered, questions outside the model's skill (square roots,
    products of large numbers) get a GLM tool call with the expression; after the tool result the
    model states the answer.
Prompts are rendered by the chat template itself (transformers' apply_chat_template), so what the
model sees in training is exactly what moeserve renders when serving. Loss is on the assistant's
generated part only. Runs on one GPU in a few minutes; prints a held-out accuracy check at the end.

Usage: python3 tools/train_demo.py --template configs/templates/glm5.jinja --out DIR [--seconds 270]
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
import time

try:
    import torch
except ImportError:  # data generation can be inspected without torch
    torch = None

SPECIAL = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
           "<|assistant|>", "<|observation|>"]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
        "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]

CALC_TOOL = {"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression exactly and return the result.",
    "parameters": {"type": "object", "properties": {
        "expression": {"type": "string", "description": "The expression, e.g. sqrt(2025) or 4821 * 937"}},
        "required": ["expression"]}}}

SYSTEMS = ["You are a helpful assistant.", "You are a careful math tutor.", "Answer briefly.",
           "You are moeserve's demo model."]

# ------------------------------------------------------------------------------------ data

ADD_Q = ["What is {a}+{b}?", "What is {a} + {b}?", "What is {a} plus {b}?", "Compute {a} + {b}.",
         "Calculate {a} + {b}", "How much is {a} plus {b}?", "Add {a} and {b}.", "{a} + {b} = ?",
         "What's {a} plus {b}?", "Please add {a} and {b}.", "What do you get when you add {a} and {b}?",
         "Can you tell me what {a} + {b} is?", "Sum of {a} and {b}?", "{a}+{b}", "what is {a} plus {b}"]
SUB_Q = ["What is {a}-{b}?", "What is {a} - {b}?", "What is {a} minus {b}?", "Compute {a} - {b}.",
         "Calculate {a} - {b}", "How much is {a} minus {b}?", "Subtract {b} from {a}.", "{a} - {b} = ?",
         "What's {a} minus {b}?", "Take {b} away from {a}.", "What is the difference between {a} and {b}?",
         "{a}-{b}", "what is {a} minus {b}"]
MUL_Q = ["What is {a}*{b}?", "What is {a} * {b}?", "What is {a} times {b}?", "Compute {a} × {b}.",
         "Calculate {a} x {b}", "How much is {a} times {b}?", "Multiply {a} by {b}.", "{a} * {b} = ?",
         "What's {a} times {b}?", "What is the product of {a} and {b}?", "{a}x{b}", "what is {a} times {b}"]

GREET_Q = ["Hello!", "Hi", "Hi there!", "Hey", "Good morning!", "Hello, how are you?", "hello",
           "Who are you?", "What are you?", "What can you do?", "Introduce yourself.", "What is your name?"]
GREET_R = "The user greets me or asks about me. I should answer politely and say what I can do."
GREET_A = ("Hello! I am the moeserve demo model, a small mixture-of-experts language model. "
           "I can add, subtract and multiply numbers, and use a calculator tool for harder sums.")

TOOL_Q_SQRT = ["What is the square root of {n}?", "Compute sqrt({n}).", "What's the square root of {n}?",
               "Find the square root of {n}."]
TOOL_Q_BIG = ["What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "Compute {a} × {b}."]


def digits(n):
    return [int(c) for c in str(n)]


def work_add(a, b):
    da, db = digits(a)[::-1], digits(b)[::-1]
    names = ["Ones", "Tens", "Hundreds", "Thousands"]
    lines, carry, out = [f"We add {a} and {b} column by column."], 0, []
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        s = x + y + carry
        expr = f"{x} + {y}" + (f" + {carry}" if carry else "")
        if s >= 10:
            lines.append(f"{names[i]}: {expr} = {s}, write {s % 10}, carry 1.")
        else:
            lines.append(f"{names[i]}: {expr} = {s}, write {s}.")
        out.append(s % 10)
        carry = 1 if s >= 10 else 0
    if carry:
        lines.append(f"{names[len(out)]}: carry 1, write 1.")
    lines.append(f"So {a} + {b} = {a + b}.")
    return "\n".join(lines)


def work_sub(a, b):
    da, db = digits(a)[::-1], digits(b)[::-1]
    names = ["Ones", "Tens", "Hundreds"]
    lines, borrow = [f"We subtract {b} from {a} column by column."], 0
    for i in range(len(da)):
        x = da[i]
        y = db[i] if i < len(db) else 0
        if borrow:
            lines_x = f"{x} - 1 = {x - 1}, then "
            x -= 1
        else:
            lines_x = ""
        if x < y:
            lines.append(f"{names[i]}: {lines_x}{x} - {y} needs a borrow: {x + 10} - {y} = {x + 10 - y}.")
            borrow = 1
        else:
            lines.append(f"{names[i]}: {lines_x}{x} - {y} = {x - y}.")
            borrow = 0
    lines.append(f"So {a} - {b} = {a - b}.")
    return "\n".join(lines)


def work_mul(a, b):
    if a < 10:
        return f"{a} × {b} = {a * b} from the times table.\nSo {a} × {b} = {a * b}."
    t, o = divmod(a, 10)
    p1 = o * b
    lines = [f"We multiply {a} by {b}: split {a} into {t} tens and {o} ones.",
             f"Ones: {o} × {b} = {p1}, write {p1 % 10}, carry {p1 // 10}.",
             f"Tens: {t} × {b} + {p1 // 10} = {t * b + p1 // 10}, write {t * b + p1 // 10}.",
             f"So {a} × {b} = {a * b}."]
    return "\n".join(lines)


def arith(rng):
    kind = rng.choices(["add", "sub", "mul"], [0.4, 0.35, 0.25])[0]
    def num():  # favour a spread of digit counts
        return rng.choice([rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 999), rng.randint(100, 999)])
    if kind == "add":
        a, b = num(), num()
        return rng.choice(ADD_Q).format(a=a, b=b), work_add(a, b), f"{a} + {b} = {a + b}"
    if kind == "sub":
        a, b = num(), num()
        if a < b:
            a, b = b, a
        return rng.choice(SUB_Q).format(a=a, b=b), work_sub(a, b), f"{a} - {b} = {a - b}"
    a = rng.choice([rng.randint(2, 9), rng.randint(10, 99), rng.randint(10, 99)])
    b = rng.randint(2, 9)
    return rng.choice(MUL_Q).format(a=a, b=b), work_mul(a, b), f"{a} × {b} = {a * b}"


def fmt_num(x):
    if abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def tool_case(rng):
    if rng.random() < 0.5:
        n = rng.choice([rng.randint(2, 99) ** 2, rng.randint(10, 99999)])
        q = rng.choice(TOOL_Q_SQRT).format(n=n)
        expr, val = f"sqrt({n})", math.sqrt(n)
        final = f"The square root of {n} is {fmt_num(val)}."
    else:
        a, b = rng.randint(100, 99999), rng.randint(100, 9999)
        q = rng.choice(TOOL_Q_BIG).format(a=a, b=b)
        expr, val = f"{a} * {b}", a * b
        final = f"{a} × {b} = {val}."
    r1 = "This is beyond what I can compute reliably, so I will use the calculator tool."
    r2 = f"The calculator returned {fmt_num(val)}."
    return q, expr, fmt_num(val), r1, r2, final


def example(rng):
    """Returns (messages_prompt, tools, enable_thinking, target_text)."""
    msgs, tools = [], None
    if rng.random() < 0.15:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    r = rng.random()
    think = rng.random() < 0.6
    if r < 0.12:  # history turn before the question
        q0, w0, a0 = arith(rng)
        msgs += [{"role": "user", "content": q0}, {"role": "assistant", "content": a0, "reasoning_content": w0}]
    if r < 0.72:
        q, w, a = arith(rng)
        if rng.random() < 0.06:
            tools = [CALC_TOOL]
        msgs.append({"role": "user", "content": q})
        tgt = (w + "</think>" + a) if think else a
        return msgs, tools, think, tgt + "<|user|>"
    if r < 0.80:
        msgs.append({"role": "user", "content": rng.choice(GREET_Q)})
        tgt = (GREET_R + "</think>" + GREET_A) if think else GREET_A
        return msgs, tools, think, tgt + "<|user|>"
    tools = [CALC_TOOL]
    q, expr, val, r1, r2, final = tool_case(rng)
    msgs.append({"role": "user", "content": q})
    call = f"<tool_call>calculator<arg_key>expression</arg_key><arg_value>{expr}</arg_value></tool_call>"
    if r < 0.90:
        tgt = (r1 + "</think>" + call) if think else call
        return msgs, tools, think, tgt + "<|observation|>"
    msgs.append({"role": "assistant", "content": "", "reasoning_content": r1 if think else "",
                 "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                                  "arguments": {"expression": expr}}}]})
    msgs.append({"role": "tool", "content": val})
    tgt = (r2 + "</think>" + final) if think else final
    return msgs, tools, think, tgt + "<|user|>"


_TOK = None


def _init_worker(tok_dir):
    global _TOK
    from transformers import PreTrainedTokenizerFast
    _TOK = PreTrainedTokenizerFast.from_pretrained(tok_dir)


def render(tok, msgs, tools, think):
    kw = {} if think else {"enable_thinking": False}
    return tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False, **kw)


def _make(seed):
    rng = random.Random(seed)
    msgs, tools, think, tgt = example(rng)
    prompt = render(_TOK, msgs, tools, think)
    p = _TOK.encode(prompt, add_special_tokens=False)
    t = _TOK.encode(tgt, add_special_tokens=False)
    return p, t


# ------------------------------------------------------------------------------------ tokenizer

def build_tokenizer(template, out_dir, seed):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, AddedToken
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(seed)
    corpus = []
    for _ in range(30000):
        msgs, tools, think, tgt = example(rng)
        corpus.append(" ".join(m.get("content") or "" for m in msgs) + " " + tgt)
    corpus.append(json.dumps(CALC_TOOL, ensure_ascii=False))
    corpus.append(open(template).read())
    trainer = trainers.BpeTrainer(vocab_size=1536, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.chat_template = open(template).read()
    hf.save_pretrained(out_dir)
    return PreTrainedTokenizerFast.from_pretrained(out_dir)


# ------------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=270)
    ap.add_argument("--examples", type=int, default=240000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    t0 = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    tok = build_tokenizer(args.template, args.out, args.seed)
    V = len(tok)
    print(f"tokenizer: {V} tokens ({time.time() - t0:.1f}s)", flush=True)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL + TAGS}
    eos = [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]]

    with mp.Pool(min(16, os.cpu_count() or 4), initializer=_init_worker, initargs=(args.out,)) as pool:
        data = pool.map(_make, range(1000, 1000 + args.examples), chunksize=512)
    lens = [len(p) + len(t) for p, t in data]
    print(f"data: {len(data)} examples, mean len {sum(lens) / len(lens):.0f}, max {max(lens)} "
          f"({time.time() - t0:.1f}s)", flush=True)
    ex = data[0]
    print("sample:", repr(tok.decode(ex[0] + ex[1])), flush=True)

    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    cfg = Glm4MoeConfig(vocab_size=V, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
                        num_hidden_layers=5, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                        use_qk_norm=True, attention_bias=True, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1,
                        routed_scaling_factor=1.0, norm_topk_prob=True, rms_norm_eps=1e-5,
                        max_position_embeddings=2048, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                        eos_token_id=eos, pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["[gMASK]"])
    dev = "cuda"
    model = Glm4MoeForCausalLM(cfg).to(dev)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if "e_score_correction_bias" in n:
                b.copy_(torch.randn(b.shape) * 0.05)
    nparam = sum(p.numel() for p in model.parameters())
    print(f"model: {nparam / 1e6:.2f}M params", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98), weight_decay=0.01)
    B, step, warm = 192, 0, 300
    order = list(range(len(data)))
    random.shuffle(order)
    pos = 0
    pad = ids["<|endoftext|>"]
    t_train = time.time()
    model.train()
    while True:
        el = time.time() - t_train
        if el > args.seconds:
            break
        frac = el / args.seconds
        lr = 2e-3 * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gparam in opt.param_groups:
            gparam["lr"] = lr
        if pos + B > len(order):
            random.shuffle(order)
            pos = 0
        batch = [data[i] for i in order[pos:pos + B]]
        pos += B
        L = max(len(p) + len(t) for p, t in batch)
        x = torch.full((B, L), pad, dtype=torch.long)
        y = torch.full((B, L), -100, dtype=torch.long)
        am = torch.zeros((B, L), dtype=torch.long)
        for i, (p, t) in enumerate(batch):
            s = p + t
            x[i, :len(s)] = torch.tensor(s)
            y[i, len(p):len(s)] = torch.tensor(t)
            am[i, :len(s)] = 1
        x, y, am = x.to(dev), y.to(dev), am.to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, attention_mask=am)
        logits = out.logits.float()[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y[:, 1:].reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"step {step} t={el:.0f}s lr={lr:.2e} loss={loss.item():.4f} epoch={step * B / len(data):.2f}",
                  flush=True)
        step += 1
    print(f"trained {step} steps in {time.time() - t_train:.0f}s", flush=True)

    model.eval()
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    gen = {"eos_token_id": eos, "pad_token_id": pad, "bos_token_id": ids["[gMASK]"], "temperature": 0.6,
           "top_p": 0.95, "do_sample": True}
    json.dump(gen, open(os.path.join(args.out, "generation_config.json"), "w"), indent=1)

    # held-out check with transformers itself (moeserve's own eval is tools/eval_demo.mjs)
    rng = random.Random(99991)
    prompts, answers = [], []
    for i in range(200):
        q, w, a = arith(rng)
        think = i % 2 == 0
        prompts.append(render(tok, [{"role": "user", "content": q}], None, think))
        answers.append(a)
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
    with torch.no_grad():
        outs = model.generate(**enc, max_new_tokens=160, do_sample=False, eos_token_id=eos, pad_token_id=pad)
    ok = [0, 0]
    for i, o in enumerate(outs):
        text = tok.decode(o[enc["input_ids"].shape[1]:], skip_special_tokens=False)
        content = text.split("</think>")[-1]
        for s in ("<|user|>", "<|endoftext|>", "<|observation|>"):
            content = content.split(s)[0]
        ok[i % 2] += content.strip() == answers[i]
        if i < 4:
            print("eval sample:", repr(text[:300]), "expect", answers[i], flush=True)
    print(f"held-out exact (transformers, bf16): thinking {ok[0]}/100, no-thinking {ok[1]}/100", flush=True)
    print(f"total {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
