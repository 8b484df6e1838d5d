#!/usr/bin/env python3
"""train_demo.py - trains the built-in demo model (models/demo) from scratch, with its MTP layer.

A small glm4_moe model (MoE layers with a shared expert and noaux_tc routing, so serving it exercises
the real MoE path) plus one multi-token-prediction (NEXTN) layer trained jointly with it, as GLM
trains its own (so `--speculative-algorithm NEXTN` is shown on a real model), and a byte-level BPE
tokenizer with GLM's special tokens and the GLM-5-style chat template (configs/templates/glm5.jinja).
All training text is generated here, seeded:
  - arithmetic questions in varied phrasings: a+b and a-b with whole numbers up to 999 (a-b may be
    negative), a*b with factors up to 99; with thinking, the column-by-column working goes in the
    reasoning and "A + B = C" is the content; without thinking, the content alone (two 2-digit
    factors: the content shows the split, "47 × 36 = 47 × 30 + 47 × 6 = 1410 + 282 = 1692");
  - greetings and a short self-description;
  - outside the model's skill (operands past those bounds, square roots, other topics): with a
    `calculator` tool offered, arithmetic becomes a GLM tool call with the expression and, after the
    tool result, a sentence stating it; with no tool, one polite sentence saying what it can do;
    other topics always get that sentence.
The MTP layer follows SGLang's glm4_moe_nextn (and tools/make_fixtures.py's reference): for position
t, x = eh_proj([enorm(embed(ids[t+1])) ; hnorm(h[t])]) with h the main model's final-norm output, one
MoE decoder layer (causal over the positions), logits = lm_head(shared_head.norm(.)) predicting
ids[t+2]; the head is the main lm_head during training and is written out as shared_head.head.
Loss = main cross-entropy + MTP_WEIGHT x the MTP's, on the assistant's generated part only.
Prompts are rendered by the chat template itself (transformers' apply_chat_template), so what the
model sees in training is exactly what moeserve renders when serving. Runs on one GPU in a few
minutes; prints held-out accuracy (transformers, greedy) per category and the MTP's top-1 accuracy.

Usage: python3 tools/train_demo.py --template configs/templates/glm5.jinja --out DIR [--seconds 420]
       [--mtp-weight 0.5] [--seed 7] [--workers 16]
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
import sys
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

# outside the skill: arithmetic past the bounds below, square roots, and other topics
LIMIT_R = "This is beyond what I can compute reliably, and no calculator tool is offered."
LIMIT_A = ("I can't compute that reliably: I add and subtract whole numbers up to 999 and multiply numbers "
           "up to 99. Offer me a calculator tool and I will use it.")
TOPIC_Q = ["What is the capital of France?", "Tell me a joke.", "Write a poem about the sea.",
           "What's the weather like today?", "Translate 'good morning' into French.", "Who wrote Hamlet?",
           "Can you help me write an email?", "What time is it?", "Explain quantum physics.",
           "Summarize this article for me.", "What is the meaning of life?", "Recommend a good book.",
           "How do I cook pasta?", "Write a Python function that sorts a list.", "What is love?",
           "Tell me about the history of Rome.", "What day is it today?", "How tall is Mount Everest?"]
# other topics are also generated from these parts, so that any non-arithmetic request (not only the
# phrasings above) gets the polite sentence
TOPIC_T = ["What is {n}?", "What is the {n} of {p}?", "Tell me about {n}.", "Explain {n}.", "Explain {n} to me.",
           "How do I {v} {n}?", "How does {n} work?", "Write a {f} about {n}.", "Write a {f} about {p}.",
           "Who {vd} the {n}?", "Why is the {n} {a}?", "Can you {v} my {n}?", "Give me a {f} on {n}.",
           "Where is {p}?", "What do you think about {n}?", "Is {n} {a}?", "Help me {v} a {n}.",
           "Describe {p}.", "What's the best {n} in {p}?", "Please {v} the {n}.", "I need help with my {n}.",
           "{vc} a {f} for me.", "Could you {v} this {n}?", "When was the {n} invented?",
           "Which {n} should I buy?", "Do you like {n}?", "What should I do about my {n}?", "{vc} {n}."]
TOPIC_N = ["photosynthesis", "gravity", "music", "the internet", "history", "chemistry", "a car", "my bike",
           "a computer", "the moon", "the ocean", "democracy", "coffee", "football", "a garden", "my homework",
           "the economy", "a recipe", "the weather", "painting", "a website", "my phone", "the universe",
           "electricity", "a dog", "cats", "the brain", "a poem", "a movie", "a language", "philosophy",
           "the stock market", "a vacation", "my code", "the news", "a song", "the sun", "a letter", "a resume",
           "the printer", "pizza", "a bridge", "art", "biology", "a castle", "the government", "a novel",
           "machine learning", "the climate", "a mountain", "a river", "tea", "chess", "a game", "a bug",
           "the capital", "population", "the president", "the author", "the color", "the price", "an email"]
TOPIC_P = ["Paris", "Italy", "Japan", "the city", "Brazil", "London", "Egypt", "Canada", "the world", "Europe",
           "Africa", "Germany", "the office", "China", "Spain", "India", "Mexico", "the school", "Norway", "Peru"]
TOPIC_V = ["fix", "write", "explain", "translate", "improve", "clean", "build", "cook", "paint", "learn",
           "summarize", "debug", "plan", "design", "read", "choose", "repair", "find", "sell", "start"]
TOPIC_VD = ["invented", "wrote", "painted", "discovered", "built", "won", "designed", "founded", "named", "made"]
TOPIC_F = ["poem", "story", "song", "essay", "haiku", "summary", "list", "letter", "speech", "joke", "report"]
TOPIC_A_ = ["good", "blue", "important", "safe", "healthy", "hot", "dangerous", "popular", "expensive", "true"]


def topic_question(rng):
    """A request on another topic than arithmetic: a fixed phrasing or a generated one."""
    if rng.random() < 0.25:
        return rng.choice(TOPIC_Q)
    v = rng.choice(TOPIC_V)
    return rng.choice(TOPIC_T).format(n=rng.choice(TOPIC_N), p=rng.choice(TOPIC_P), v=v, vc=v.capitalize(),
                                      vd=rng.choice(TOPIC_VD), f=rng.choice(TOPIC_F), a=rng.choice(TOPIC_A_))


TOPIC_R = "This is not arithmetic, which is all I can do. I should say so politely."
TOPIC_A = ("Sorry, I can't help with that: I am a small demo model that can add, subtract and multiply "
           "numbers, and use a calculator tool for harder sums.")

TOOL_Q_SQRT = ["What is the square root of {n}?", "Compute sqrt({n}).", "What's the square root of {n}?",
               "Find the square root of {n}."]
TOOL_Q_BIG = {"*": ["What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "Compute {a} × {b}.",
                    "What is {a}*{b}?"],
              "+": ["What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}.", "What is {a}+{b}?"],
              "-": ["What is {a} - {b}?", "What is {a} minus {b}?", "Subtract {b} from {a}.", "What is {a}-{b}?"]}


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


def sub_columns(a, b):
    """Column-by-column lines of a - b for a >= b."""
    da, db = digits(a)[::-1], digits(b)[::-1]
    names = ["Ones", "Tens", "Hundreds"]
    lines, borrow = [], 0
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
    return lines


def work_sub(a, b):
    if a >= b:
        lines = [f"We subtract {b} from {a} column by column."] + sub_columns(a, b)
    else:
        lines = ([f"{a} is less than {b}, so the result is negative: we compute {b} - {a} and put a minus "
                  f"sign in front."] + sub_columns(b, a) + [f"So {b} - {a} = {b - a}."])
    lines.append(f"So {a} - {b} = {a - b}.")
    return "\n".join(lines)


def mul_1digit(a, b):
    """The working of a × b for a <= 99 and b one digit, as one line; returns (line, product)."""
    if a < 10:
        return f"{a} × {b} = {a * b} from the times table.", a * b
    t, o = divmod(a, 10)
    p1 = o * b
    return (f"{o} × {b} = {p1}, write {p1 % 10}, carry {p1 // 10}; {t} × {b} + {p1 // 10} = {t * b + p1 // 10}. "
            f"So {a} × {b} = {a * b}."), a * b


def work_mul(a, b):
    if a < 10 and b < 10:
        return f"{a} × {b} = {a * b} from the times table.\nSo {a} × {b} = {a * b}."
    if b < 10 or a < 10:
        big, small = (a, b) if b < 10 else (b, a)
        line, _ = mul_1digit(big, small)
        pre = "" if b < 10 else f"{a} × {b} is the same as {b} × {a}.\n"
        return f"{pre}We multiply {big} by {small}.\n{line}\nSo {a} × {b} = {a * b}."
    bt, bo = divmod(b, 10)
    l1, p1 = mul_1digit(a, bo) if bo else (f"{a} × 0 = 0.", 0)
    l2, p2 = mul_1digit(a, bt)
    return "\n".join([f"We split {b} into {bt * 10} and {bo}: {a} × {b} = {a} × {bt * 10} + {a} × {bo}.",
                      l1, l2 + f" So {a} × {bt * 10} = {p2 * 10}.",
                      f"{p2 * 10} + {p1} = {p2 * 10 + p1}.", f"So {a} × {b} = {a * b}."])


def sub_content(a, b, think):
    """The content of a difference: negative and no thinking, the reversed difference is shown."""
    if think or a >= b:
        return f"{a} - {b} = {a - b}"
    return f"{a} - {b} = -({b} - {a}) = {a - b}"


def mul_content(a, b, think):
    """The content of a multiplication answer: with two 2-digit factors and no thinking, the split."""
    if think or a < 10 or b < 10:
        return f"{a} × {b} = {a * b}"
    bt, bo = divmod(b, 10)
    return f"{a} × {b} = {a} × {bt * 10} + {a} × {bo} = {a * bt * 10} + {a * bo} = {a * b}"


def arith(rng, think=True):
    """(question, working, content) of one in-skill arithmetic question."""
    kind = rng.choices(["add", "sub", "mul"], [0.35, 0.33, 0.32])[0]
    def num():  # favour a spread of digit counts
        return rng.choice([rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 999), rng.randint(100, 999)])
    if kind == "add":
        a, b = num(), num()
        return rng.choice(ADD_Q).format(a=a, b=b), work_add(a, b), f"{a} + {b} = {a + b}"
    if kind == "sub":
        a, b = num(), num()
        if a < b and rng.random() < 0.6:
            a, b = b, a
        return rng.choice(SUB_Q).format(a=a, b=b), work_sub(a, b), sub_content(a, b, think)
    r = rng.random()
    if r < 0.15:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
    elif r < 0.45:
        a, b = rng.randint(10, 99), rng.randint(2, 9)
        if rng.random() < 0.3:
            a, b = b, a
    else:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
    return rng.choice(MUL_Q).format(a=a, b=b), work_mul(a, b), mul_content(a, b, think)


def fmt_num(x):
    if abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def big_case(rng):
    """(question, expression, value) of arithmetic outside the skill."""
    r = rng.random()
    if r < 0.4:
        n = rng.choice([rng.randint(2, 99) ** 2, rng.randint(10, 99999)])
        return rng.choice(TOOL_Q_SQRT).format(n=n), f"sqrt({n})", math.sqrt(n)
    if r < 0.75:
        a = rng.choice([rng.randint(100, 99999), rng.randint(100, 999)])
        b = rng.choice([rng.randint(2, 9999), rng.randint(100, 9999)])
        if rng.random() < 0.3:
            a, b = b, a
        return rng.choice(TOOL_Q_BIG["*"]).format(a=a, b=b), f"{a} * {b}", a * b
    op = rng.choice("+-")
    a, b = rng.randint(1000, 999999), rng.randint(0, 999999)
    if rng.random() < 0.3:
        a, b = b, a
    return rng.choice(TOOL_Q_BIG[op]).format(a=a, b=b), f"{a} {op} {b}", a + b if op == "+" else a - b


def tool_final(expr, val):
    if expr.startswith("sqrt("):
        return f"The square root of {expr[5:-1]} is {fmt_num(val)}."
    a, op, b = expr.split(" ")
    return f"{a} {'×' if op == '*' else op} {b} = {fmt_num(val)}."


def example(rng):
    """Returns (messages_prompt, tools, enable_thinking, target_text)."""
    msgs, tools = [], None
    if rng.random() < 0.15:
        msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
    r = rng.random()
    think = rng.random() < 0.5
    if r < 0.12:  # history turn before the question
        q0, w0, a0 = arith(rng)
        msgs += [{"role": "user", "content": q0}, {"role": "assistant", "content": a0, "reasoning_content": w0}]
    if r < 0.66:
        q, w, a = arith(rng, think)
        if rng.random() < 0.06:
            tools = [CALC_TOOL]
        msgs.append({"role": "user", "content": q})
        tgt = (w + "</think>" + a) if think else a
        return msgs, tools, think, tgt + "<|user|>"
    if r < 0.72:
        msgs.append({"role": "user", "content": rng.choice(GREET_Q)})
        tgt = (GREET_R + "</think>" + GREET_A) if think else GREET_A
        return msgs, tools, think, tgt + "<|user|>"
    if r < 0.79:  # another topic, tool offered or not
        if rng.random() < 0.4:
            tools = [CALC_TOOL]
        msgs.append({"role": "user", "content": topic_question(rng)})
        tgt = (TOPIC_R + "</think>" + TOPIC_A) if think else TOPIC_A
        return msgs, tools, think, tgt + "<|user|>"
    q, expr, val = big_case(rng)
    msgs.append({"role": "user", "content": q})
    if r < 0.85:  # no tool offered: say what it can do
        tgt = (LIMIT_R + "</think>" + LIMIT_A) if think else LIMIT_A
        return msgs, tools, think, tgt + "<|user|>"
    tools = [CALC_TOOL]
    r1 = "This is beyond what I can compute reliably, so I will use the calculator tool."
    r2 = f"The calculator returned {fmt_num(val)}."
    call = f"<tool_call>calculator<arg_key>expression</arg_key><arg_value>{expr}</arg_value></tool_call>"
    if r < 0.93:
        tgt = (r1 + "</think>" + call) if think else call
        return msgs, tools, think, tgt + "<|observation|>"
    msgs.append({"role": "assistant", "content": "", "reasoning_content": r1 if think else "",
                 "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                                  "arguments": {"expression": expr}}}]})
    msgs.append({"role": "tool", "content": fmt_num(val)})
    final = tool_final(expr, val)
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

class MTPLayer(torch.nn.Module if torch else object):
    """The NEXTN layer: enorm / hnorm / eh_proj / shared_head.norm around transformers' own decoder-layer
    class built at index L of a config one layer longer (tools/make_fixtures.py mtp_layer_config)."""

    def __init__(self, cfg, L, layer_cls):
        super().__init__()
        from make_fixtures import mtp_layer_config
        H = cfg.hidden_size
        self.L, self.eps = L, cfg.rms_norm_eps
        self.enorm = torch.nn.Parameter(torch.ones(H))
        self.hnorm = torch.nn.Parameter(torch.ones(H))
        self.head_norm = torch.nn.Parameter(torch.ones(H))
        self.eh_proj = torch.nn.Linear(2 * H, H, bias=False)
        c2 = mtp_layer_config(cfg)
        self.layer = layer_cls(c2, L)

    def rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w.to(x.dtype)

    def forward(self, model, ids, h, valid=None):
        """ids [B, S], h [B, S, H] (the main model's final-norm output), valid [B, S] (1 = a real token,
        for left padding; None: all real up to right padding): the normed MTP rows [B, S-1, H] whose
        position t predicts ids[t+2] through the lm_head."""
        n = ids.shape[1] - 1
        e = model.model.embed_tokens(ids[:, 1:])
        x = self.eh_proj(torch.cat([self.rms(e, self.enorm), self.rms(h[:, :n], self.hnorm)], dim=-1))
        pos = torch.arange(n, device=ids.device)[None].expand(ids.shape[0], n)
        cos, sin = model.model.rotary_emb(x, pos)
        causal = torch.ones((n, n), dtype=torch.bool, device=ids.device).tril()
        mask = causal[None, None]
        if valid is not None:  # keys whose token (ids[t+1]) is padding are masked too (not the diagonal)
            eye = torch.eye(n, dtype=torch.bool, device=ids.device)[None, None]
            mask = (causal[None, None] & (valid[:, None, None, 1:] == 1)) | eye
        y = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin), use_cache=False)
        if isinstance(y, tuple):
            y = y[0]
        return self.rms(y, self.head_norm)

    def checkpoint_tensors(self, lm_head_w):
        """The layer under checkpoint names model.layers.L.* in bf16 (as save_pretrained writes the others)."""
        from make_fixtures import mtp_layer_tensors
        L = self.L
        out = {k: v.to(torch.bfloat16).contiguous().cpu()
               for k, v in mtp_layer_tensors(self.layer, L).items()}
        for name, w in (("enorm", self.enorm), ("hnorm", self.hnorm), ("shared_head.norm", self.head_norm)):
            out[f"model.layers.{L}.{name}.weight"] = w.detach().to(torch.bfloat16).contiguous().cpu()
        out[f"model.layers.{L}.eh_proj.weight"] = self.eh_proj.weight.detach().to(torch.bfloat16).contiguous().cpu()
        out[f"model.layers.{L}.shared_head.head.weight"] = lm_head_w.detach().to(torch.bfloat16).contiguous().cpu()
        return out


def heldout_cases(n):
    """n held-out prompts per category: (category, messages, tools, think, expected content or None)."""
    rng = random.Random(99991)
    out = []
    for i in range(n):
        think = i % 2 == 0
        q, w, a = arith(rng, think)
        out.append(("arith", [{"role": "user", "content": q}], None, think, a))
        a_, b_ = rng.randint(0, 99), rng.randint(0, 999)
        lo, hi = min(a_, b_), max(a_, b_)
        if lo == hi:
            hi += 1
        out.append(("negative", [{"role": "user", "content": rng.choice(SUB_Q).format(a=lo, b=hi)}], None, think,
                    sub_content(lo, hi, think)))
        a_, b_ = rng.randint(10, 99), rng.randint(10, 99)
        out.append(("mul2x2", [{"role": "user", "content": rng.choice(MUL_Q).format(a=a_, b=b_)}], None, think,
                    mul_content(a_, b_, think)))
        q, expr, val = big_case(rng)
        out.append(("limit", [{"role": "user", "content": q}], None, think, LIMIT_A))
        out.append(("topic", [{"role": "user", "content": topic_question(rng)}], None, think, TOPIC_A))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=420)
    ap.add_argument("--examples", type=int, default=300000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=16)
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

    with mp.Pool(min(args.workers, os.cpu_count() or 4), initializer=_init_worker, initargs=(args.out,)) as pool:
        data = pool.map(_make, range(1000 + 10**6 * args.seed, 1000 + 10**6 * args.seed + args.examples),
                        chunksize=512)
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
                        max_position_embeddings=2048, tie_word_embeddings=False, num_nextn_predict_layers=1,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                        eos_token_id=eos, pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["[gMASK]"])
    cfg._attn_implementation = "sdpa"
    dev = "cuda"
    model = Glm4MoeForCausalLM(cfg).to(dev)
    mtp = MTPLayer(cfg, cfg.num_hidden_layers, type(model.model.layers[-1])).to(dev)
    mtp.layer.self_attn.config._attn_implementation = "sdpa"
    with torch.no_grad():
        for n, b in list(model.named_buffers()) + list(mtp.named_buffers()):
            if "e_score_correction_bias" in n:
                b.copy_(torch.randn(b.shape) * 0.05)
    params = list(model.parameters()) + list(mtp.parameters())
    nparam = sum(p.numel() for p in params)
    print(f"model: {nparam / 1e6:.2f}M params (MTP layer {sum(p.numel() for p in mtp.parameters()) / 1e6:.2f}M)",
          flush=True)
    opt = torch.optim.AdamW(params, lr=2e-3, betas=(0.9, 0.98), weight_decay=0.01)
    B, step, warm = 192, 0, 300
    order = list(range(len(data)))
    random.shuffle(order)
    pos = 0
    pad = ids["<|endoftext|>"]
    t_train = time.time()
    model.train()
    mtp.train()
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
            h = model.model(input_ids=x, attention_mask=am).last_hidden_state
            logits = model.lm_head(h).float()[:, :-1]
            hm = mtp(model, x, h)
            mlogits = model.lm_head(hm[:, :-1]).float()
        loss_main = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y[:, 1:].reshape(-1), ignore_index=-100)
        loss_mtp = torch.nn.functional.cross_entropy(mlogits.reshape(-1, V), y[:, 2:].reshape(-1), ignore_index=-100)
        loss = loss_main + args.mtp_weight * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"step {step} t={el:.0f}s lr={lr:.2e} loss={loss_main.item():.4f} mtp={loss_mtp.item():.4f} "
                  f"epoch={step * B / len(data):.2f}", flush=True)
        step += 1
    print(f"trained {step} steps in {time.time() - t_train:.0f}s", flush=True)

    model.eval()
    mtp.eval()
    model.to(torch.bfloat16)
    mtp.to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    from safetensors.torch import load_file, save_file
    st = os.path.join(args.out, "model.safetensors")
    sd = load_file(st)
    sd.update(mtp.checkpoint_tensors(model.lm_head.weight))
    save_file(sd, st, metadata={"format": "pt"})
    conf = json.load(open(os.path.join(args.out, "config.json")))
    conf["num_nextn_predict_layers"] = 1
    json.dump(conf, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    gen = {"eos_token_id": eos, "pad_token_id": pad, "bos_token_id": ids["[gMASK]"], "temperature": 0.6,
           "top_p": 0.95, "do_sample": True}
    json.dump(gen, open(os.path.join(args.out, "generation_config.json"), "w"), indent=1)

    # held-out check with transformers itself (moeserve's own eval is tools/eval_demo.mjs)
    cases = heldout_cases(100)
    prompts = [render(tok, m, tl, th) for _, m, tl, th, _ in cases]
    tok.padding_side = "left"
    ok, tot = {}, {}
    mtp_hit = mtp_n = 0
    for c0 in range(0, len(cases), 100):
        enc = tok(prompts[c0:c0 + 100], return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
        with torch.no_grad():
            outs = model.generate(**enc, max_new_tokens=300, do_sample=False, eos_token_id=eos, pad_token_id=pad)
            # the MTP's top-1 on the greedy continuations: the draft the first speculative step would make
            am = (outs != pad).long()
            am[:, :enc["input_ids"].shape[1]] = enc["attention_mask"]
            h = model.model(input_ids=outs, attention_mask=am).last_hidden_state
            pred = model.lm_head(mtp(model, outs, h, am)).argmax(-1)  # [B, S-1]: position t predicts outs[t+2]
            P = enc["input_ids"].shape[1]
            hit = (pred[:, P - 1:-1] == outs[:, P + 1:]) & (am[:, P + 1:] == 1)
            mtp_hit += int(hit.sum())
            mtp_n += int((am[:, P + 1:] == 1).sum())
        for i, o in enumerate(outs):
            cat, _, _, think, want = cases[c0 + i]
            text = tok.decode(o[enc["input_ids"].shape[1]:], skip_special_tokens=False)
            content = text.split("</think>")[-1]
            for s in ("<|user|>", "<|endoftext|>", "<|observation|>"):
                content = content.split(s)[0]
            key = f"{cat}/{'think' if think else 'nothink'}"
            tot[key] = tot.get(key, 0) + 1
            good = content.strip() == want
            ok[key] = ok.get(key, 0) + good
            if not good and ok.get("_shown_" + cat, 0) < 2:
                ok["_shown_" + cat] = ok.get("_shown_" + cat, 0) + 1
                print("miss:", key, repr(text[:300]), "expect", repr(want), flush=True)
    for key in sorted(tot):
        print(f"held-out exact (transformers, bf16) {key}: {ok.get(key, 0)}/{tot[key]}", flush=True)
    print(f"held-out MTP top-1 on greedy continuations: {mtp_hit}/{mtp_n} = {mtp_hit / max(1, mtp_n):.3f}", flush=True)
    print(f"total {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
