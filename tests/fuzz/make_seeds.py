#!/usr/bin/env python3
"""Writes the seed corpora in tests/fuzz/corpus/<harness>/ (run from anywhere;
rerun after changing it).  Seeds come from the repository's real files
(tokenizer configs and templates, the test vectors) and from the layouts of
the published Hugging Face files (config.json, generation_config.json,
safetensors headers and indexes), kept small so each run starts quickly."""
import json, os, struct, shutil, hashlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOK = os.path.join(ROOT, "tests", "data", "tokenizers")
OUT = os.path.join(HERE, "corpus")


def put(harness, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ------------------------------------------------------------
ST = {"F32": ("<f", 4), "F16": ("<e", 2), "BF16": (None, 2), "I64": ("<q", 8), "I32": ("<i", 4),
      "I16": ("<h", 2), "I8": ("<b", 1), "U8": ("<B", 1), "BOOL": ("<?", 1), "F64": ("<d", 8)}


def safetensors(tensors, metadata=None, pad=8):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        size = ST[dt][1]
        raw = bytes((i * 7 + 3) & 0xff for i in range(n * size))
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % pad)
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors():
    llama = [("model.embed_tokens.weight", "BF16", [16, 8]), ("model.layers.0.input_layernorm.weight", "BF16", [8]),
             ("model.layers.0.self_attn.q_proj.weight", "BF16", [8, 8]),
             ("model.layers.0.self_attn.k_proj.weight", "BF16", [4, 8]),
             ("model.layers.0.mlp.down_proj.weight", "BF16", [8, 12]), ("model.norm.weight", "BF16", [8]),
             ("lm_head.weight", "BF16", [16, 8])]
    put("fuzz_safetensors", safetensors(llama, {"format": "pt"}))
    put("fuzz_safetensors", safetensors([(f"t.{dt.lower()}", dt, [3, 2]) for dt in ST]))
    put("fuzz_safetensors", safetensors([("empty", "F32", [0, 4]), ("scalar", "F32", []), ("v", "I64", [5])],
                                        {"format": "pt", "note": "x"}))
    put("fuzz_safetensors", safetensors([("a", "F16", [2, 3, 4, 1]), ("b", "U8", [7])], pad=1))
    put("fuzz_safetensors", safetensors([]))


def seeds_index():
    wm = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
          "model.layers.0.a": "model-00001-of-00002.safetensors",
          "lm_head.weight": "model-00002-of-00002.safetensors",
          "model.layers.1.b": "model-00002-of-00002.safetensors"}
    put("fuzz_st_index", json.dumps({"metadata": {"total_size": 80}, "weight_map": wm}, indent=2))
    one = {k: v for k, v in wm.items() if v.startswith("model-00001")}
    put("fuzz_st_index", json.dumps({"weight_map": one}))
    put("fuzz_st_index", json.dumps({"metadata": {}, "weight_map": dict(wm, extra="model-00003-of-00003.safetensors")}))


# ---- config.json / generation_config.json -----------------------------------
def seeds_config():
    llama3 = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
              "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
              "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
              "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
              "pretraining_tp": 1, "rms_norm_eps": 1e-05,
              "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
              "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 128256}
    qwen3 = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
             "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
             "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
             "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
             "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
             "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
    mistral = {"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
               "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
               "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
               "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "vocab_size": 32768}
    qwen2 = {"architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645,
             "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
             "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
             "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
             "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False,
             "vocab_size": 151936}
    tiny = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
            "rope_scaling": {"type": "linear", "factor": 2.0}, "torch_dtype": "float32"}
    for c in (llama3, qwen3, mistral, qwen2, tiny):
        put("fuzz_config", json.dumps(c, indent=2))
    put("fuzz_generation_config", json.dumps({"bos_token_id": 128000, "do_sample": True,
        "eos_token_id": [128001, 128008, 128009], "temperature": 0.6, "top_p": 0.9,
        "transformers_version": "4.45.0"}, indent=2))
    put("fuzz_generation_config", json.dumps({"bos_token_id": 151643, "do_sample": True,
        "eos_token_id": [151645, 151643], "pad_token_id": 151643, "temperature": 0.6, "top_k": 20,
        "top_p": 0.95, "transformers_version": "4.51.0"}, indent=2))
    put("fuzz_generation_config", json.dumps({"max_new_tokens": 32, "repetition_penalty": 1.1,
        "min_p": 0.05, "do_sample": False, "eos_token_id": 2}))


# ---- tokenizers -------------------------------------------------------------
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def seeds_tokenizer_load():
    b2u = bytes_to_unicode()
    byte_vocab = {b2u[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or")]
    vocab = dict(byte_vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    split = {"type": "Split", "pattern": {"Regex": json.load(open(os.path.join(TOK, "qwen3", "tokenizer.json")))
                                          ["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]},
             "behavior": "Isolated", "invert": False}
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    added = [{"id": len(vocab), "content": "<|im_start|>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True},
             {"id": len(vocab) + 1, "content": "<|im_end|>", "single_word": False, "lstrip": True,
              "rstrip": True, "normalized": False, "special": True},
             {"id": len(vocab) + 2, "content": "hello", "single_word": True, "lstrip": False,
              "rstrip": False, "normalized": True, "special": False}]
    base = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, bl]},
            "post_processor": bl, "decoder": bl,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}
    put("fuzz_tokenizer_load", json.dumps(base))
    # Llama 3 style: list-form merges, ignore_merges, template post-processor, bos from it.
    l3 = json.loads(json.dumps(base))
    l3["normalizer"] = None
    l3["model"]["ignore_merges"] = True
    l3["model"]["merges"] = [[a, b] for a, b in merges]
    l3["added_tokens"][0]["content"] = "<|begin_of_text|>"
    l3["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [len(vocab)],
                                                  "tokens": ["<|begin_of_text|>"]}}}]}
    put("fuzz_tokenizer_load", json.dumps(l3))
    # Character-level, non-byte-level: normalizer and pre-tokenizer chains.
    chars = {c: i for i, c in enumerate("abc-123 eéxAfi")}
    chars["a-"] = len(chars)
    char_tok = {"added_tokens": [{"id": 40, "content": "<s>", "special": True, "normalized": False,
                                  "lstrip": False, "rstrip": False, "single_word": False}],
                "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Lowercase"},
                               {"type": "Replace", "pattern": {"String": "x"}, "content": "-"},
                               {"type": "Prepend", "prepend": " "}, {"type": "Strip", "strip_left": True,
                                                                     "strip_right": False}]},
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": True},
                    {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext", "invert": False}]},
                "post_processor": {"type": "BertProcessing", "sep": ["<s>", 40], "cls": ["<s>", 40]},
                "decoder": None,
                "model": {"type": "BPE", "ignore_merges": True, "vocab": chars, "merges": ["a -"]}}
    put("fuzz_tokenizer_load", json.dumps(char_tok))
    cfg = json.dumps({"add_bos_token": True, "add_eos_token": False, "bos_token": "<|im_start|>",
                      "eos_token": {"content": "<|im_end|>"}})
    put("fuzz_tokenizer_load", json.dumps(base) + "\0" + cfg)
    put("fuzz_tokenizer_load", json.dumps(dict(char_tok, post_processor={"type": "RobertaProcessing",
        "sep": ["<s>", 40], "cls": ["<s>", 40]})))


def seeds_tokenize():
    n = 0
    for name, which in (("qwen3", 0), ("llama3", 1)):
        for line in open(os.path.join(TOK, name, "vectors.jsonl"), encoding="utf-8"):
            v = json.loads(line)
            text = v["text"].encode("utf-8")
            if len(text) > 512:
                continue
            flags = which | (2 if v.get("add_special_tokens") else 0) | (n % 2) * 4
            put("fuzz_tokenize", bytes([flags]) + text)
            if n % 8 == 0:  # id mode: the expected ids, decoded
                put("fuzz_tokenize", bytes([which | 8 | (n % 16 and 4)]) +
                    b"".join(struct.pack("<i", i) for i in v["ids"]))
            n += 1


# ---- chat templates -----------------------------------------------------------
def seeds_chat_template():
    for name in ("qwen3", "llama3"):
        cfg = json.load(open(os.path.join(TOK, name, "tokenizer_config.json"), encoding="utf-8"))
        put("fuzz_chat_template", cfg["chat_template"])
    for src in [
        "{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}",
        "{%- set ns = namespace(n=0) -%}{% for m in messages if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
        "{% macro f(x, y='d') %}[{{ x }}{{ y }}]{% endmacro %}{{ f(1) }}{{ f(2, y=3) }}{{ range(3) | list }}",
        "{{ messages | tojson(indent=2) }}{{ tools[0] | tojson }}{{ 'a,b' .split(',') | join('|') }}",
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% elif x is defined %}x{% else %}{{ raise_exception('no') }}{% endif %}",
        "{{ messages[-1].content[0].text | upper }}{{ 'Hi'.startswith('H') }}{{ [3,1,2] | sort | first }}{{ {'a':1}.items() | list }}",
        "{% for m in messages %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.revindex0 }}{% if not loop.last %},{% endif %}{% endfor %}",
        "{{ 'x' * 3 }}{{ 7 // 2 }}{{ -7 % 3 }}{{ 2 ** 10 }}{{ 'y' if 1 else 'n' }}{{ 'abc'[::-1] }}{{ none is none }}",
    ]:
        put("fuzz_chat_template", src)


# ---- TP plans ----------------------------------------------------------------
def seeds_plan():
    builtin = {"lm_head": "colwise_gather_output",
               "model.layers.*.self_attn.q_proj": "colwise", "model.layers.*.self_attn.k_proj": "colwise",
               "model.layers.*.self_attn.v_proj": "colwise", "model.layers.*.self_attn.o_proj": "rowwise",
               "model.layers.*.mlp.gate_proj": "colwise", "model.layers.*.mlp.up_proj": "colwise",
               "model.layers.*.mlp.down_proj": "rowwise"}
    # byte 0: bits 0-1 arch, 2-3 tp_size - 1, bit 4 tied embeddings
    put("fuzz_plan", bytes([0x04]) + json.dumps(builtin).encode())
    put("fuzz_plan", bytes([0x03 | 0x0c]) + json.dumps(dict(builtin, **{
        "model.layers.*.self_attn.q_norm": "replicate", "model.layers.*.self_attn.k_norm": "replicate"})).encode())
    put("fuzz_plan", bytes([0x16]) + json.dumps(dict(builtin, **{"model.embed_tokens": "embedding_rowwise"})).encode())
    put("fuzz_plan", bytes([0x09]) + json.dumps({"model.embed_tokens": "embedding_colwise", "model.norm": "sequence_parallel",
        "model.layers.0.self_attn.qkv_proj": "packed_colwise", "model.layers.1": "gather",
        "model.layers.*.mlp.down_proj": "local_rowwise", "model.layers.*.mlp.up_proj": "local_colwise",
        "model.layers.*.mlp": "local_params", "model.layers.*.self_attn.o_proj": "rowwise_split_input",
        "lm_head": "colwise_rep"}).encode())
    put("fuzz_plan", bytes([0x05]) + json.dumps({"model.layers.*.self_attn.k_proj": "rowwise",
        "model.layers.*.mlp.down_proj": "all_reduce", "model.layers.*.mlp.gate_proj": "local",
        "layers.*.mlp.up_proj": "replicated_with_grad_allreduce", "nothing.matches": "colwise",
        "model.layers.*.self_attn.v_proj": 3, "model.layers.*.self_attn.q_proj": "moe_tp_experts"}).encode())
    put("fuzz_plan", bytes([0x0e]) + b'{"model.layers.*.self_attn.q_proj": "packed_rowwise", '
        b'"model.layers.*.mlp.down_proj": "local_packed_rowwise", "lm_head": "ep_router"}')


if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    seeds_safetensors()
    seeds_index()
    seeds_config()
    seeds_tokenizer_load()
    seeds_tokenize()
    seeds_chat_template()
    seeds_plan()
    for h in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, h))
        size = sum(os.path.getsize(os.path.join(OUT, h, f)) for f in files)
        print(f"{h}: {len(files)} seeds, {size} bytes")
