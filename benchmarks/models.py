"""Today's models under d2s: transformers and timm, tiny random configs, offline.

    python benchmarks/models.py [--only NAME ...] [--transformers | --timm]
                                [--skip-compile] [--skip-export] [--skip-save]
                                [--skip-d2s-export]
                                [--timeout T] [--json OUT]

Needs the optional benchmark dependencies (`pip install -e .[bench]`:
transformers, timm, tqdm). Every model is built from a tiny configuration
(`AutoModel.from_config`, `timm.create_model(..., pretrained=False)`), never
from the hub, and called on three inputs: a padded batch (an attention mask
with zeros), an unpadded batch (mask all ones) and another batch size and
length; vision models get a batch, another batch size and a resized image
where the model accepts one. Columns:

  d2s     `d2s.declarative(model)` on the three inputs, one after another:
          outputs of eager's types (ModelOutput, cache classes, tuples) and
          values (atol = rtol = 1e-4). A value that differs from eager's, or
          an output holding a graph Variable, is WRONG: the worst outcome,
          counted apart from failures.
  save    `d2s.jit.save` with `None` for the batch and length (or image)
          dimensions, then `d2s.jit.load` in a fresh process that never
          imports transformers or timm, on the same three inputs (the
          tensors of the result, in order, against eager's).
  d2s_export  `d2s.export` (a torch.export.ExportedProgram of the program,
          `torch.cond` / `while_loop` for its control flow) with the save
          column's `None` dimensions, its module run on the three inputs
          (the tensors of the result, in order, against eager's).
  compile `torch.compile(fullgraph=True, backend="eager")` on the three inputs.
  export  `torch.export.export` with automatic dynamic dimensions, its
          module run on the three inputs.

Each model runs in a subprocess of its own (a crash or a hang costs one
row); each column gets --timeout seconds. Prints one row per model, the
failures with their causes, and one summary line.
"""

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4
COLUMNS = ("d2s", "save", "d2s_export", "compile", "export")


# -- the zoo -------------------------------------------------------------------------------

@dataclasses.dataclass
class Entry:
    """One model: how to build it and what it is called with.

    `kind`: "text" (input_ids + attention_mask), "seq2seq" (also
    decoder_input_ids), "image" (pixel_values), "audio" (input_values),
    "features" (Whisper's log-mel input_features + decoder_input_ids).
    `resize`: the model accepts another image size. `config`: overrides of
    the tiny defaults (transformers) or create_model keywords (timm)."""
    name: str
    family: str          # "transformers" or "timm"
    kind: str
    target: str          # model_type (transformers) or model name (timm)
    head: str = "AutoModel"
    config: dict = dataclasses.field(default_factory=dict)
    resize: bool = True
    image: int = 32


TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, hidden_act="gelu", pad_token_id=0)
DECODER = dict(num_key_value_heads=2, head_dim=8)
SEQ2SEQ = dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
               pad_token_id=1, decoder_start_token_id=2)


def _text(name, target, head="AutoModel", **config):
    return Entry(name, "transformers", "text", target, head, {**TINY, **config})


def _causal(name, target, **config):
    return Entry(name, "transformers", "text", target, "AutoModelForCausalLM", {**TINY, **DECODER, **config})


def _vision(name, target, image=32, resize=False, **config):
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=image,
                patch_size=8, num_channels=3)
    return Entry(name, "transformers", "image", target, "AutoModel", {**base, **config}, resize, image)


def _timm(name, image=64, resize=True, **kwargs):
    return Entry(name, "timm", "image", name, config={"num_classes": 10, **kwargs}, resize=resize, image=image)


ZOO = [
    # encoders
    _text("bert", "bert"), _text("roberta", "roberta", pad_token_id=1), _text("distilbert", "distilbert",
                                                                             dim=32, n_layers=2, n_heads=4,
                                                                             hidden_dim=37),
    _text("albert", "albert", embedding_size=16), _text("electra", "electra", embedding_size=16),
    _text("deberta-v2", "deberta-v2"), _text("mpnet", "mpnet"), _text("roformer", "roformer"),
    _text("convbert", "convbert"), _text("mobilebert", "mobilebert", embedding_size=16, intra_bottleneck_size=32,
                                         true_hidden_size=32, num_feedforward_networks=1),
    _text("squeezebert", "squeezebert", embedding_size=32, intermediate_size=64), _text("ernie", "ernie"),
    _text("megatron-bert", "megatron-bert"), _text("xlm-roberta", "xlm-roberta", pad_token_id=1),
    # causal LMs, returning their KV caches
    _causal("gpt2", "gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64),
    _causal("llama", "llama"), _causal("mistral", "mistral"), _causal("qwen2", "qwen2"),
    _causal("qwen3", "qwen3"), _causal("gemma", "gemma"), _causal("phi", "phi"),
    _causal("gpt-neox", "gpt_neox", rotary_pct=0.5), _causal("opt", "opt", ffn_dim=37, word_embed_proj_dim=32),
    _causal("bloom", "bloom", n_layer=2, n_head=4),
    Entry("falcon", "transformers", "text", "falcon", "AutoModelForCausalLM", dict(TINY, multi_query=True)),
    _causal("gptj", "gptj", n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64),
    _causal("codegen", "codegen", n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, n_ctx=64),
    # (intermediate_size 32: torch._grouped_mm wants 16-byte aligned strides)
    _causal("mixtral", "mixtral", num_local_experts=4, num_experts_per_tok=2, intermediate_size=32),
    # encoder-decoders
    Entry("t5", "transformers", "seq2seq", "t5", "AutoModelForSeq2SeqLM",
          dict(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, pad_token_id=0,
               decoder_start_token_id=0)),
    Entry("bart", "transformers", "seq2seq", "bart", "AutoModelForSeq2SeqLM", dict(SEQ2SEQ)),
    Entry("marian", "transformers", "seq2seq", "marian", "AutoModelForSeq2SeqLM", dict(SEQ2SEQ, pad_token_id=0)),
    Entry("pegasus", "transformers", "seq2seq", "pegasus", "AutoModelForSeq2SeqLM", dict(SEQ2SEQ, pad_token_id=0)),
    # vision
    _vision("vit", "vit"), _vision("deit", "deit"), _vision("beit", "beit"), _vision("dinov2", "dinov2"),
    Entry("swin", "transformers", "image", "swin", "AutoModel", dict(image_size=32, patch_size=4, embed_dim=16,
          depths=[1, 1], num_heads=[2, 2], window_size=2), resize=False),
    _vision("convnext", "convnext", resize=True, hidden_sizes=[8, 16], depths=[1, 1]),
    _vision("resnet", "resnet", resize=True, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]),
    _vision("segformer", "segformer", resize=True, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
            hidden_sizes=[8, 16], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
            decoder_hidden_size=16),
    # audio
    Entry("wav2vec2", "transformers", "audio", "wav2vec2", "AutoModel",
          dict(TINY, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
               num_conv_pos_embedding_groups=2, do_stable_layer_norm=False, feat_extract_norm="group")),
    Entry("hubert", "transformers", "audio", "hubert", "AutoModel",
          dict(TINY, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=16,
               num_conv_pos_embedding_groups=2)),
    Entry("whisper", "transformers", "features", "whisper", "AutoModel",
          dict(SEQ2SEQ, num_mel_bins=8, max_source_positions=16, max_target_positions=64, pad_token_id=0,
               decoder_start_token_id=1)),
    # timm
    _timm("resnet10t"), _timm("resnet18d"), _timm("mobilenetv3_small_050"), _timm("mobilenetv2_050"),
    _timm("efficientnet_b0"), _timm("lcnet_050"), _timm("ghostnet_050"), _timm("regnetx_002"),
    _timm("convnext_atto"), _timm("repvgg_a0"), _timm("mixnet_s"), _timm("dla34"),
    _timm("vit_tiny_patch16_224", img_size=64, dynamic_img_size=True),
    _timm("deit_tiny_patch16_224", img_size=64, dynamic_img_size=True),
    _timm("levit_128s", image=224, resize=False), _timm("efficientvit_m0", image=224, resize=False),
    _timm("mobilevitv2_050"), _timm("poolformer_s12"),
    # added 2026-11-26: today's decoders (sliding-window and full masks side by side, mixtures of
    # experts, state-space layers), more encoders and encoder-decoders, newer timm families
    _causal("gemma2", "gemma2", query_pre_attn_scalar=8, sliding_window=4),
    _causal("gemma3_text", "gemma3_text", query_pre_attn_scalar=8, sliding_window=4),
    _causal("phi3", "phi3"), _causal("starcoder2", "starcoder2"), _causal("olmo2", "olmo2"), _causal("cohere", "cohere"),
    _causal("granite", "granite"), _causal("smollm3", "smollm3"), _causal("exaone4", "exaone4", sliding_window=4),
    _causal("falcon_h1", "falcon_h1"),
    Entry("deepseek_v3", "transformers", "text", "deepseek_v3", "AutoModelForCausalLM",
          dict(TINY, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_group=1,
               topk_group=1, first_k_dense_replace=1, intermediate_size=32)),
    _causal("qwen2_moe", "qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32),
    _causal("qwen3_moe", "qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    _causal("olmoe", "olmoe", num_experts=4, num_experts_per_tok=2, intermediate_size=32),
    _causal("gpt_oss", "gpt_oss", num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, sliding_window=4),
    _causal("mamba", "mamba", state_size=4, expand=2, conv_kernel=4),
    _causal("rwkv", "rwkv", attention_hidden_size=32, context_length=64),
    _text("big_bird", "big_bird", attention_type="original_full"),
    _text("longformer", "longformer", attention_window=4),
    Entry("xlnet", "transformers", "text", "xlnet", "AutoModel",
          dict(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37, pad_token_id=0)),
    Entry("mbart", "transformers", "seq2seq", "mbart", "AutoModelForSeq2SeqLM", dict(SEQ2SEQ)),
    Entry("mt5", "transformers", "seq2seq", "mt5", "AutoModelForSeq2SeqLM",
          dict(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, pad_token_id=0,
               decoder_start_token_id=0)),
    Entry("switch_transformers", "transformers", "seq2seq", "switch_transformers", "AutoModelForSeq2SeqLM",
          dict(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_sparse_encoder_layers=1,
               num_sparse_decoder_layers=1, num_heads=4, num_experts=4, pad_token_id=0, decoder_start_token_id=0)),
    _timm("coatnet_nano_rw_224", image=224, resize=False), _timm("maxvit_nano_rw_256", image=256, resize=False),
    _timm("fastvit_t8"), _timm("tiny_vit_5m_224", image=224, resize=False), _timm("edgenext_xx_small"),
    _timm("eva02_tiny_patch14_224", image=56, resize=False, img_size=56),
    # added 2026-11-28: experts split by `counts.tolist()` (JetMoE); PhiMoE
    _causal("jetmoe", "jetmoe"),
    # a custom autograd.Function in the router, in training only (saved inline for both modes)
    _causal("phimoe", "phimoe", intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
    # added 2026-11-28, later: sizes across a decision torch takes on the size (a saved model's size paths):
    # Inception-v3's 1-pixel map at 96 px, SHViT wider than its traced image, Mamba-2's chunked scan
    _timm("inception_v3", image=96), _timm("shvit_s1"),
    _causal("mamba2", "mamba2", state_size=4, num_heads=4, head_dim=16, n_groups=1, expand=2, conv_kernel=4,
            chunk_size=8),
]


def hide_broken_torchvision():
    """transformers imports torchvision when it is installed, and timm needs
    it. A build made for another torch (PyPI's CUDA wheel beside the local CPU
    torch) fails on import, in `torchvision._meta_registrations`, which
    registers fake kernels for native ops its extension could not load
    ("operator torchvision::nms does not exist"). Without those registrations
    its Python layers load (timm's FrozenBatchNorm2d, transforms), and no
    model here calls a torchvision op. If even that fails, torchvision is
    hidden so transformers runs without it; timm then says why it failed.
    Returns the error, or None when torchvision loads (or is absent)."""
    import types
    try:
        import torchvision  # noqa: F401
        return None
    except ImportError:
        return None
    except Exception as exc:  # noqa: BLE001 - RuntimeError/OSError from its native ops
        first = exc
    _forget_torchvision()
    sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
    try:
        import torchvision  # noqa: F401,F811
        return None
    except Exception:  # noqa: BLE001
        _forget_torchvision()
        sys.modules["torchvision"] = None  # find_spec answers None: "not installed"
        return f"torchvision is installed but does not load ({cause(first)})"


def _forget_torchvision():
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]


def build(entry):
    """The model in eval mode, seeded: every process builds the same weights."""
    import torch
    torch.manual_seed(0)
    broken = hide_broken_torchvision()
    if entry.family == "timm":
        if broken:
            raise RuntimeError(f"timm needs torchvision: {broken}")
        import timm
        model = timm.create_model(entry.target, pretrained=False, **entry.config)
    else:
        import transformers
        config = transformers.AutoConfig.for_model(entry.target, **entry.config)
        model = getattr(transformers, entry.head).from_config(config)
    return model.eval()


def cases(entry):
    """[(label, {argument name: tensor})]: the three inputs, in the order of
    the model's forward parameters (a saved model takes them positionally)."""
    import torch
    g = torch.Generator().manual_seed(1)
    if entry.kind == "image":
        size = entry.image
        shapes = [("batch 2", 2, size), ("batch 1", 1, size)]
        shapes.append(("resized", 2, size + size // 2) if entry.resize else ("batch 3", 3, size))
        name = "x" if entry.family == "timm" else "pixel_values"
        return [(label, {name: torch.randn(b, 3, s, s, generator=g)}) for label, b, s in shapes]
    if entry.kind == "audio":
        out = []
        for label, b, n, pad in [("padded", 2, 400, 120), ("unpadded", 2, 400, 0), ("other size", 3, 560, 80)]:
            mask = torch.ones(b, n, dtype=torch.long)
            mask[0, n - pad:] = 0
            out.append((label, {"input_values": torch.randn(b, n, generator=g), "attention_mask": mask}))
        return out
    out = []
    for label, b, n, pad in [("padded", 2, 8, 3), ("unpadded", 2, 8, 0), ("other size", 3, 5, 2)]:
        ids = torch.randint(3, 99, (b, n), generator=g)
        mask = torch.ones(b, n, dtype=torch.long)
        mask[0, n - pad:] = 0
        if entry.kind == "features":
            args = {"input_features": torch.randn(b, 8, 32, generator=g), "decoder_input_ids": ids}
        else:
            args = {"input_ids": ids, "attention_mask": mask}
            if entry.kind == "seq2seq":
                args["decoder_input_ids"] = torch.randint(3, 99, (b, n - 1), generator=g)
        out.append((label, args))
    return out


def specs(entry, example):
    """InputSpecs for jit.save: `None` for batch and length (image sides
    too where the model takes other sizes)."""
    import d2s
    out = []
    for name, t in example.items():
        shape = [None] + list(t.shape[1:])
        if name in ("input_ids", "attention_mask", "decoder_input_ids", "input_values"):
            shape = [None] * t.dim()
        elif name in ("pixel_values", "x") and entry.resize:
            shape = [None, 3, None, None]
        out.append(d2s.InputSpec(shape, t.dtype, name=name))
    return out


def positional_ok(model, names):
    import inspect
    params = list(inspect.signature(model.forward).parameters)
    return params[:len(names)] == list(names)


def keywords(model, names):
    """`model` called with `names` as keywords from positional arguments,
    as a user wraps a model whose forward takes them in another order (a
    saved model is called positionally)."""
    import torch

    class Keywords(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, a, b=None, c=None):
            return self.model(**dict(zip(names, (a, b, c))))

    return Keywords().eval()


# -- comparing with eager --------------------------------------------------------------------

def structure(value, depth=0):
    """What a result is, types included, with tensors as (dtype, shape):
    two results with equal structures have the same types, keys and shapes."""
    import torch
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape))
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value if not isinstance(value, float) else "float")
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if depth > 8:
        return (kind,)
    if isinstance(value, dict):
        return (kind, tuple((k, structure(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (kind, tuple(structure(v, depth + 1) for v in value))
    fields = getattr(value, "__dict__", None)
    if fields is None:
        return (kind,)
    return (kind, tuple((k, structure(v, depth + 1)) for k, v in fields.items()
                        if not k.startswith("__") and not callable(v)))


def leaves(value, depth=0):
    """The tensors of a result in a fixed order (dicts by insertion, objects
    by attribute), the order a saved model's plain structure keeps."""
    import torch
    if isinstance(value, torch.Tensor) or type(value).__name__ == "Variable":
        return [value]
    if depth > 8 or value is None or isinstance(value, (bool, int, float, str)):
        return []
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [v for k, v in getattr(value, "__dict__", {}).items() if not k.startswith("__") and not callable(v)]
    return [t for v in items for t in leaves(v, depth + 1)]


def compare(expected, got, types=True):
    """None when `got` matches `expected`; else ("wrong" | "fail", why)."""
    import torch
    want, have = leaves(expected), leaves(got)
    graph = [t for t in have if not isinstance(t, torch.Tensor)]
    if graph:
        return "wrong", f"the result holds a graph value ({type(graph[0]).__name__}) where eager has a tensor"
    if types and structure(expected) != structure(got):
        return "fail", f"result types differ: eager {_short(expected)}, got {_short(got)}"
    if len(want) != len(have):
        return "fail", f"{len(have)} tensors in the result, eager has {len(want)}"
    for i, (a, b) in enumerate(zip(want, have)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return "fail", f"tensor {i}: {b.dtype}{list(b.shape)}, eager {a.dtype}{list(a.shape)}"
        if not torch.allclose(a.float(), b.float(), atol=TOL, rtol=TOL, equal_nan=True):
            return "wrong", f"tensor {i} differs from eager's by {(a.float() - b.float()).abs().max().item():.3g}"
    return None


def _short(value):
    return type(value).__name__ + (f"[{', '.join(value.keys())}]" if isinstance(value, dict) else "")


def cause(exc):
    """One line: the exception's type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


# -- the columns -------------------------------------------------------------------------------

class ColumnTimeout(BaseException):
    """A column ran past --timeout. Not an Exception: d2s retries a failed
    trace at larger sizes (`except Exception`), which would swallow it and
    let the column run on until the model's whole process is killed, losing
    the row's other columns."""


def _alarm(signum, frame):
    raise ColumnTimeout("timed out")


def run_d2s(model, entry, inputs, expected):
    import d2s
    static = d2s.declarative(model)
    for (label, args), want in zip(inputs, expected):
        got = static(**args)
        bad = compare(want, got)
        if bad:
            return bad[0], f"{label}: {bad[1]}"
    return "pass", ""


def run_compile(model, entry, inputs, expected):
    import torch
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    for (label, args), want in zip(inputs, expected):
        bad = compare(want, compiled(**args))
        if bad:
            return bad[0], f"{label}: {bad[1]}"
    return "pass", ""


def run_export(model, entry, inputs, expected):
    import torch
    args = inputs[0][1]
    auto = torch.export.Dim.AUTO
    dynamic = {n: {i: auto for i in range(t.dim()) if i == 0 or s.shape[i] == -1}
               for (n, t), s in zip(args.items(), specs(entry, args))}
    program = torch.export.export(model, (), dict(args), dynamic_shapes=dynamic, strict=False)
    module = program.module()
    for (label, args), want in zip(inputs, expected):
        bad = compare(want, module(**args), types=False)
        if bad:
            return bad[0], f"{label}: {bad[1]}"
    return "pass", ""


def run_d2s_export(model, entry, inputs, expected):
    import d2s
    names = list(inputs[0][1])
    if not positional_ok(model, names):
        model = keywords(model, names)
    module = d2s.export(model, input_spec=specs(entry, inputs[0][1])).module()
    for (label, args), want in zip(inputs, expected):
        bad = compare(leaves(want), leaves(module(*args.values())), types=False)
        if bad:
            return bad[0], f"{label}: {bad[1]}"
    return "pass", ""


def run_save(model, entry, inputs, expected):
    """jit.save with None dimensions, then load and run in a fresh process."""
    import torch
    import d2s
    names = list(inputs[0][1])
    if not positional_ok(model, names):
        model = keywords(model, names)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model")
        d2s.jit.save(model, path, input_spec=specs(entry, inputs[0][1]))
        torch.save({"inputs": [(label, list(args.values())) for label, args in inputs],
                    "expected": [leaves(w) for w in expected]}, os.path.join(tmp, "cases.pt"))
        proc = subprocess.run([sys.executable, __file__, "--reload", tmp], capture_output=True, text=True,
                              env=_env(), timeout=300)
        if proc.returncode != 0:
            return "fail", "reload process: " + (proc.stderr.strip().splitlines() or ["crashed"])[-1][:300]
        status, why = json.loads(proc.stdout.strip().splitlines()[-1])
        return status, why


def reload_worker(tmp):
    """In a fresh process: load the saved model and run the cases; never
    imports transformers or timm (a deployment has neither)."""
    import torch
    import d2s
    data = torch.load(os.path.join(tmp, "cases.pt"))
    model = d2s.jit.load(os.path.join(tmp, "model"))
    result = ["pass", ""]
    for (label, args), want in zip(data["inputs"], data["expected"]):
        try:
            got = model(*args)
        except Exception as exc:  # noqa: BLE001 - reported as the row's cause
            result = ["fail", f"{label}: {cause(exc)}"]
            break
        bad = compare(want, leaves(got), types=False)
        if bad:
            result = [bad[0], f"{label}: {bad[1]}"]
            break
    for package in ("transformers", "timm"):
        if package in sys.modules:
            result = ["fail", f"loading the saved model imported {package}"]
    print(json.dumps(result))


RUNNERS = {"d2s": run_d2s, "save": run_save, "d2s_export": run_d2s_export, "compile": run_compile,
           "export": run_export}


def worker(name, columns, timeout):
    """One model in this process: eager first, then each column."""
    import warnings
    import torch
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    entry = next(e for e in ZOO if e.name == name)
    row = {"model": name, "family": entry.family}
    signal.signal(signal.SIGALRM, _alarm)
    try:
        signal.alarm(timeout)
        model = build(entry)
        inputs = cases(entry)
        with torch.no_grad():
            expected = [model(**args) for _, args in inputs]
        signal.alarm(0)
    except (Exception, ColumnTimeout) as exc:  # noqa: BLE001 - eager itself ran past --timeout too
        row["eager"] = ["fail", cause(exc)]
        print(json.dumps(row))
        return
    row["eager"] = ["pass", ""]
    for column in columns:
        start = time.perf_counter()
        try:
            signal.alarm(timeout)
            with torch.no_grad():
                row[column] = list(RUNNERS[column](build(entry), entry, inputs, expected))
        except ColumnTimeout:
            row[column] = ["timeout", f"over {timeout} s"]
        except Exception as exc:  # noqa: BLE001
            where = traceback.extract_tb(exc.__traceback__)[-1]
            row[column] = ["fail", f"{cause(exc)} ({os.path.basename(where.filename)}:{where.lineno})"]
        finally:
            signal.alarm(0)
        row[column].append(round(time.perf_counter() - start, 1))
    print(json.dumps(row))


# -- the driver --------------------------------------------------------------------------------

def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), REPO) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_model(name, columns, timeout):
    cmd = [sys.executable, __file__, "--worker", name, "--timeout", str(timeout), "--columns", ",".join(columns)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout * (len(columns) + 2))
    except subprocess.TimeoutExpired:
        return {"model": name, "eager": ["timeout", "the model's process ran out of time"]}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "eager": ["crash", f"exit {proc.returncode}: {tail[:300]}"]}
    return json.loads(lines[-1])


MARK = {"pass": "ok", "fail": "FAIL", "wrong": "WRONG", "timeout": "TIME", "crash": "CRASH"}


def report(rows, columns):
    width = max(len(r["model"]) for r in rows) + 2
    print(f"{'model':<{width}}{'eager':<8}" + "".join(f"{c:<12}" for c in columns))
    for r in rows:
        cells = [MARK.get(r.get(c, ["-"])[0], "-") for c in columns]
        print(f"{r['model']:<{width}}{MARK[r['eager'][0]]:<8}" + "".join(f"{c:<12}" for c in cells))
    print("\nfailures:")
    for r in rows:
        for c in ("eager",) + tuple(columns):
            status, why = (r.get(c) or ["-", ""])[:2]
            if status not in ("pass", "-"):
                print(f"  {r['model']:<{width}}{c:<11}{MARK.get(status, status):<6} {why}")
    ran = [r for r in rows if r["eager"][0] == "pass"]
    parts = []
    for c in columns:
        done = [r for r in ran if c in r]
        passed = sum(r[c][0] == "pass" for r in done)
        wrong = sum(r[c][0] == "wrong" for r in done)
        parts.append(f"{c} {passed}/{len(done)}" + (f" ({wrong} WRONG)" if wrong else ""))
    print(f"\nsummary: {len(ran)} models ({sum(r['family'] == 'transformers' for r in ran)} transformers, "
          f"{sum(r['family'] == 'timm' for r in ran)} timm): " + ", ".join(parts))


def select(only=None, family=None):
    entries = [e for e in ZOO if (not only or e.name in only) and (not family or e.family == family)]
    unknown = set(only or ()) - {e.name for e in ZOO}
    if unknown:
        raise SystemExit(f"unknown models: {', '.join(sorted(unknown))}; known: {', '.join(e.name for e in ZOO)}")
    return entries


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", help="model names (the table's first column)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--transformers", action="store_const", const="transformers", dest="family")
    group.add_argument("--timm", action="store_const", const="timm", dest="family")
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--skip-export", action="store_true")
    p.add_argument("--skip-save", action="store_true")
    p.add_argument("--skip-d2s-export", action="store_true")
    p.add_argument("--timeout", type=int, default=180, help="seconds per model and column")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--columns", help=argparse.SUPPRESS)
    p.add_argument("--reload", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.reload:
        return reload_worker(a.reload)
    if a.worker:
        return worker(a.worker, a.columns.split(",") if a.columns else [], a.timeout)
    columns = [c for c in COLUMNS if not getattr(a, f"skip_{c}", False)]
    entries = select(a.only, a.family)
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = lambda xs, **_: xs  # noqa: E731
    rows = []
    for entry in tqdm(entries, desc="models", unit="model"):
        rows.append(run_model(entry.name, columns, a.timeout))
        if a.json:  # after every row: a long run stopped part way keeps what it measured
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    report(rows, columns)


if __name__ == "__main__":
    main()
