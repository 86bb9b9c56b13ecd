"""Independent tokenizer facts for tests/tokenizer.rs, from the Python side:
the Hugging Face `tokenizers` binding's ids for sample texts, the Engram
compressed-token map built exactly as v41-flash.md §8.1 states (with the
binding's own normalisers), and a conversation rendered and encoded by
DeepSeek's `deepseek-recipe` (DeepseekV41Encoding).

Usage: tokenizer_ref.py --tokenizer tokenizer.json --texts texts.json --out out.json
"""

import argparse
import json

from tokenizers import Regex, Tokenizer, normalizers

SENTINEL = "\uE000"


def engram_map(tok):
    norm = normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), SENTINEL),
            normalizers.Strip(),
            normalizers.Replace(SENTINEL, " "),
        ]
    )
    classes, out = {}, []
    for tid in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([tid], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(tid)
        else:
            key = norm.normalize_str(text) or text
        out.append(classes.setdefault(key, len(classes)))
    return out, len(classes)


def chat(path):
    import deepseek_recipe as r

    enc = r.DeepseekV41Encoding().with_tokenizer(r.Tokenizer.from_file(path))
    conv = r.Conversation(
        [r.UserMessage("Name a prime above 10. Ответь кратко, 谢谢!")], thinking_mode=False
    )
    return {"ids": enc.encode(conv), "text": enc.render_conversation(conv).prompt}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--texts", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    texts = json.load(open(a.texts, encoding="utf-8"))
    m, n = engram_map(tok)
    json.dump(
        {
            "len": tok.get_vocab_size(with_added_tokens=True),
            "encodings": [tok.encode(t, add_special_tokens=False).ids for t in texts],
            "engram_map": m,
            "engram_classes": n,
            "chat": chat(a.tokenizer),
        },
        open(a.out, "w", encoding="utf-8"),
    )


if __name__ == "__main__":
    main()
