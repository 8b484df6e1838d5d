// gen_strings.mjs - seeded generator of hard tokenizer inputs, shared by the conformance test and
// the benchmark. Each case is {text} (a JS string) or {bytes} (a Buffer that may hold invalid
// UTF-8, which Node decodes with U+FFFD replacement before the reference tokenizers see it).

export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const cp = (c) => String.fromCodePoint(c);

export function makeGen(seed, specials) {
  const r = rng(seed);
  const int = (n) => Math.floor(r() * n);
  const pick = (a) => a[int(a.length)];
  const range = (lo, hi) => cp(lo + int(hi - lo + 1));
  const rep = (f, n) => Array.from({ length: n }, f).join("");

  const latin = ["the", "Quick", "BROWN", "fox", "naïve", "café", "résumé", "Zürich", "Ångström", "façade",
    "Straße", "ﬁnance", "İstanbul", "ΣΟΦΙΑ", "Ῥόδος", "œuvre", "Ærø", "São", "João", "crème", "brûlée",
    "DŽungla", "ǅemal", "Ǆ", "ŉ", "ſtraße", "Kelvin", "ß", "ẞ", "ﬀ", "Æ", "ĳ", "Ĳ", "x", "I", "a", "A"];
  const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D",
    "'ſ", "'\u212A", "n't", "N'T", "'", "''", "’s", "’ll"];
  const words = () => {
    switch (int(12)) {
      case 0: return rep(() => range(0x4e00, 0x9fa5), 1 + int(6)); // CJK
      case 1: return rep(() => range(0x3041, 0x3096), 1 + int(5)) + rep(() => range(0x30a1, 0x30fa), int(4)); // kana
      case 2: return rep(() => range(0xac00, 0xd7a3), 1 + int(4)); // Hangul
      case 3: return rep(() => range(0x0621, 0x064a), 2 + int(6)) + (int(3) ? "" : range(0x064b, 0x0652)); // Arabic
      case 4: return rep(() => range(0x0905, 0x0939) + (int(2) ? range(0x093e, 0x094d) : ""), 1 + int(4)); // Devanagari
      case 5: return rep(() => range(0x0e01, 0x0e2e) + (int(3) ? "" : range(0x0e31, 0x0e3a)), 2 + int(6)); // Thai
      case 6: return rep(() => range(0x0430, 0x044f), 2 + int(8)); // Cyrillic
      case 7: return rep(() => range(0x03b1, 0x03c9), 2 + int(6)); // Greek
      case 8: return pick(latin) + (int(3) ? "" : rep(() => range(0x0300, 0x036f), 1 + int(3))); // combining
      default: return pick(latin);
    }
  };
  const emoji = () => pick([
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️‍🔥", "🇫🇷", "🇯🇵🇺🇸", "1️⃣", "#️⃣", "✨", "🧑🏿‍💻", "👩🏻‍🤝‍👨🏾",
    "☺️", "🫠", "🦀", "\u{1F9D1}\u200D\u{1F680}", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🇦", "\u200D", "\uFE0F"]);
  const digits = () => pick([
    () => rep(() => String(int(10)), 1 + int(12)),
    () => String(int(100000)) + "." + String(int(1000)),
    () => rep(() => range(0x0660, 0x0669), 1 + int(5)), // Arabic-Indic
    () => rep(() => range(0xff10, 0xff19), 1 + int(4)), // fullwidth
    () => pick(["²", "³", "¹", "¼", "½", "Ⅻ", "ⅷ", "①", "⑳", "٣", "߃", "१२३", "๓๔"]),
    () => "-" + int(1000) + "e" + int(20),
    () => "0x" + int(1 << 30).toString(16),
  ])();
  const spaces = () => pick([" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n ",
    "\u00a0", "\u3000", "\u2003", "\u0085", "\u2028", "\u2029", "\ufeff", "\u200b", "\u180e", "\f", "\v",
    " \t \n", "    ", "        ", "\n    ", "\n\t"]);
  const punct = () => pick([".", ",", "!", "?", "...", "—", "–", "-", "(", ")", "[", "]", "{", "}", "<", ">",
    "\"", "'", "`", "~", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=", "|", "\\", "/", ":", ";", "«", "»",
    "¿", "¡", "。", "、", "，", "！", "？", "「", "」", "…", "•", "©", "®", "™", "€", "£", "¥", "→", "∑", "≠", "√",
    "\ufffd", "\ue000", "\u{10ffff}", "\ufffe", "\u0000", "\u0001", "\u001b", "\u007f", "\u{1d400}", "\u{20000}"]);
  const code = () => pick([
    "int main(void) {\n\treturn 0;\n}\n", "def f(x):\r\n    return x  \r\n", "  if (a &&b) {  \n", "\t\t}\n",
    "x = [1, 2, 3];  // comment   \n", "SELECT * FROM t WHERE id=42;", "<div class=\"a\">hi</div>",
    "{\"key\": \"value\", \"n\": 1}", "a->b->c", "foo_bar_baz(qux)", "https://example.com/a?b=c&d=e",
    "$ ls -la | grep \"x\" > /dev/null 2>&1", "@@ -1,3 +1,4 @@", "#include <stdio.h>", "    \n    \n"]);
  const special = () => specials.length ? pick(specials) : "<s>";
  const longWord = () => pick([
    () => rep(() => pick("abcdefghijklmnopqrstuvwxyz"), 200 + int(900)),
    () => "a".repeat(300 + int(700)),
    () => rep(() => range(0x4e00, 0x9fa5), 100 + int(300)),
    () => rep(() => String(int(10)), 300 + int(500)),
    () => " ".repeat(100 + int(300)) + "x",
    () => "\n".repeat(40 + int(100)),
    () => rep(() => pick(["ab", "ba", "aab", "b"]), 200 + int(300)),
  ])();

  const piece = () => {
    const k = int(100);
    if (k < 30) return words();
    if (k < 40) return pick(contractions);
    if (k < 48) return digits();
    if (k < 58) return spaces();
    if (k < 70) return punct();
    if (k < 76) return emoji();
    if (k < 82) return code();
    if (k < 90) return special();
    if (k < 91) return longWord();
    return words() + pick(contractions);
  };

  const invalidBytes = () => pick([
    [0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xc3], [0xe2, 0x82], [0xe2, 0x28, 0xa1], [0xed, 0xa0, 0x80],
    [0xed, 0xbf, 0xbf], [0xf0, 0x9f, 0x98], [0xf0, 0x80, 0x80, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xf5, 0x80],
    [0xff], [0xfe, 0xff], [0xe0, 0x80, 0x80], [0xe0, 0xa0], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xc2, 0xc2, 0xa9],
  ]);

  return function next(i) {
    const n = i % 25 === 0 ? 1 : 1 + int(i % 7 === 0 ? 40 : 12);
    const parts = [];
    for (let j = 0; j < n; j++) {
      parts.push(piece());
      if (int(3) === 0) parts.push(" ");
    }
    let text = parts.join("");
    if (int(20) === 0) text = " " + text;
    if (int(20) === 0) text += "  ";
    if (i % 10 === 3) {
      // invalid UTF-8 spliced between valid pieces
      const chunks = [];
      for (const p of [piece(), piece(), piece()]) {
        chunks.push(Buffer.from(p, "utf8"));
        if (int(2)) chunks.push(Buffer.from(invalidBytes()));
      }
      return { bytes: Buffer.concat(chunks) };
    }
    return { text };
  };
}

// The deterministic corpus used by bench-tokenizer's node side when no file is given.
export function makeCorpus(mb, seed = 7) {
  const g = makeGen(seed, []);
  const out = [];
  let n = 0;
  for (let i = 0; n < mb * 1e6; i++) {
    const c = g(i);
    const s = c.text ?? c.bytes.toString("utf8");
    out.push(s);
    n += Buffer.byteLength(s);
  }
  return out.join("\n");
}
