"""Command line: `python -m cosmos3_runtime {generate,reason,demo,info,quantize,make-tiny,serve-isaaclab,
isaaclab-camera} ...`."""

import argparse
import difflib
import logging
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from . import isaaclab
from .action import MODES, PRESETS, TIERS, VIEW_POINTS, WIDTHS, ActionRequest
from .checkpoint import Checkpoint, read_json, resolve
from . import timing
from .errors import Cosmos3Error, InputError, reworded
from .geometry import latent_frames, latent_size
from .controls import derive, uint8_frames
from .media import (IMAGE_TYPES, LATENT_TYPE, check_output, read_array, read_image, read_video, save, save_actions,
                    save_wav, video_header)
from .reasoner import DEFAULT_MAX_NEW_TOKENS, Sampling, check_max_new_tokens, read_clip
from .parallel import init_from_env
from .guardrails import load as load_guardrails
from .kinds import Controlled
from .pipeline import load, planner, prompt_list
from .progress import Report
from .request import Request, add_arguments, cli_flag, options_from_args
from .tiny import FRAMEWISE, KINDS, SIZES, make_tiny_checkpoint, sim_bimanual_block, sim_transfer_block
from .transfer import HINTS, check_hints, summary as transfer_summary
from .transformer import Cosmos3Transformer, tower_of
from .weights import detect
from .weights.files import stored_bytes
from .weights.format import planned_bytes
from .weights.gguf import GGUF
from .weights.gguf_convert import WRITABLE, convert, describe_types


def cmd_make_tiny(args) -> None:
    if args.sim_transfer and args.sim_bimanual:
        raise InputError("give --sim-transfer or --sim-bimanual, not both")
    if args.framewise and not args.sim_transfer:
        raise InputError("--framewise is a Sim-Transfer layout: give it with --sim-transfer")
    causal = (sim_transfer_block(**FRAMEWISE) if args.framewise else sim_transfer_block()) if args.sim_transfer else \
        sim_bimanual_block() if args.sim_bimanual else None
    root = make_tiny_checkpoint(args.folder, kind="gated" if causal else args.kind, size=args.size,
                                distilled=args.distilled or bool(causal), sound=args.sound,
                                action=args.action or args.sim_bimanual, causal=causal)
    name = f"Sim-Transfer (causal, gated, {'framewise' if args.framewise else 'chunkwise'})" if args.sim_transfer else \
        "Sim-Bimanual (causal, gated, actions)" if args.sim_bimanual else args.kind
    print(f"wrote a random {args.size} {name} checkpoint to {root}")


SERVICE_OPTIONS = ("causal_history", "compile")  # the request options serve-isaaclab plans every episode with


def cmd_serve_isaaclab(args) -> None:
    options = options_from_args(args, SERVICE_OPTIONS)
    with isaaclab.listening(args.endpoint, args.allow_remote) as listener:  # a busy or bad endpoint: before loading
        isaaclab.probe(planner(args.checkpoint, args.device, args.dtype, local_files_only=True, quantize=args.quantize,
                               transformer_file=args.transformer_file), options)  # before any weight is read
        pipe = load(args.checkpoint, device=args.device, dtype=args.dtype, local_files_only=True,
                    **low_vram_options(args))
        print(f"{pipe.checkpoint.root}: {pipe.variant.describe()}", flush=True)
        service = isaaclab.Service(pipe, args.max_episode_frames or None, **options)
        if args.warmup:
            print("warming up: one episode of blank controls at 832x480", flush=True)
            service.warm_up()
        print(f"serving Isaac Lab's Cosmos cameras at {isaaclab.endpoint_of(listener)} (episodes of at most "
              f"{args.max_episode_frames or 'any number of'} frames; stop with Ctrl+C or a shutdown)", flush=True)
        try:
            service.serve(listener)
        except KeyboardInterrupt:
            print("stopped", flush=True)


def cmd_isaaclab_camera(args) -> None:
    """Play a clip through a running service as Isaac Lab's camera sends it: its first frame, then 4 an update."""
    (hint, clip), = read_controls([args.control])[0].items()
    frames = uint8_frames(clip)
    count = 1 + (len(frames) - 1) // isaaclab.UPDATE_FRAMES * isaaclab.UPDATE_FRAMES
    if count < 1 + isaaclab.UPDATE_FRAMES:
        raise InputError(f"--control has {len(frames)} frame(s): an episode is its first frame and updates of "
                         f"{isaaclab.UPDATE_FRAMES}; give at least {1 + isaaclab.UPDATE_FRAMES}")
    check_output(args.output)
    with isaaclab.Client(args.endpoint, wait=args.wait) as client:
        fps = client.status()["capabilities"]["fps"]
        client.open(args.prompt, hint, frames.shape[1], frames.shape[2], count, args.seed)
        made = [client.step(frames[:1])]
        made += [client.step(frames[i : i + isaaclab.UPDATE_FRAMES]) for i in range(1, count, isaaclab.UPDATE_FRAMES)]
        client.close()
        if args.shutdown:
            client.shutdown()
    print(f"{count} frames of {hint} control in, {sum(len(m) for m in made)} out")
    for path in save(torch.from_numpy(np.concatenate(made)).float() / 255, args.output, fps):
        print(f"wrote {path}")


def cmd_generate(args) -> None:
    # Everything a user can get wrong is checked here, before any weight is read.
    options = options_from_args(args)
    options["image"] = read_image(args.image) if args.image else None
    options["video"] = read_video(args.video) if args.video else None
    options["control_videos"], source_fps = read_controls(args.control_videos) if args.control_videos else (None, None)
    options["keyframes"] = read_keyframes(args.keyframes) if args.keyframes else None
    if source_fps and options["fps"] is None:  # keep the source's timing; the authors' 30 is --fps 30
        options["fps"] = source_fps
    tensors_out = check_output(args.output).suffix.lower() == LATENT_TYPE
    latents_only = tensors_out and options["control_videos"] is None  # a transfer's tensors are its frames
    if args.sound_output and not (args.sound or args.audio):
        raise InputError("--sound-output needs --sound (or --audio)")
    if args.sound_output:
        check_output(args.sound_output, kinds=(".wav",))
    if args.action_mode:  # the observation belongs to the action request
        options["action"] = ActionRequest(
            mode=args.action_mode, chunk_size=args.chunk_size, domain=args.domain, resolution_tier=args.resolution_tier,
            actions=read_array(args.actions, "actions") if args.actions else None, image=options.pop("image"),
            video=options.pop("video"), view_point=args.view_point, preset=args.preset,
            state=read_array(args.state, "state") if args.state else None,
            stats=read_json(Path(args.action_stats)) if args.action_stats else None,
        )
    request = Request.build(**options, output="latents" if latents_only else "frames")
    parallel, device = None, args.device
    if args.sp > 1 or args.cfg_parallel:
        parallel, device = init_from_env(args.sp, args.cfg_parallel)
    main = parallel is None or parallel.is_main
    say = print if main else lambda *a, **k: None
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            say("No --checkpoint given: using a tiny RANDOM checkpoint (real layout, meaningless weights); "
                "the output is noise.")
            kind = args.kind or ("gated" if args.control_videos or request.sound_use else "edge")
            args.checkpoint = make_tiny_checkpoint(tmp, kind=kind, sound=kind == "gated" and bool(request.sound_use))
        planning = planner(args.checkpoint, device, args.dtype, load_vae_weights=not latents_only,
                           quantize=args.quantize, transformer_file=args.transformer_file)
        plan = planning.plan(args.prompt, request)
        planning.check(plan)
        guardrails = None
        if args.guardrails:  # checked before the model loads: a blocked prompt reads no generator weight
            guardrails = load_guardrails(args.guardrails_device, fail_closed=not args.guardrails_fail_open,
                                         allow_download=True)
            guardrails.check_prompts(prompt_list(args.prompt))
        guess = planning.duration(plan) if main else None
        if guess is not None:
            say(timing.note(guess, spelled))
        pipe = load(args.checkpoint, device=device, dtype=args.dtype, vae_dtype=args.vae_dtype, **low_vram_options(args))
        say(f"{pipe.checkpoint.root}: {pipe.variant.describe()}")
        report = Report(say, sys.stdout.isatty())  # a terminal: lines rewritten; a file or a pipe: whole lines
        result = pipe.generate(args.prompt, request, callback=report.step, parallel=parallel, progress=report.stage,
                               guardrails=guardrails)
        s = result.settings
        controls = transfer_summary(s.kind.controls) if isinstance(s.kind, Controlled) else ""
        say(f"{s.mode} {s.width}x{s.height}, {s.num_frames} frames @ {s.fps:g} fps, {s.steps} steps "
            f"({s.schedule}), guidance {s.guidance_scale:g}" + controls
            + (f"; {result.cache}" if result.cache else ""))
        if not main:
            return
        if tensors_out:
            from safetensors.torch import save_file

            name, value = ("latents", result.latents) if latents_only else ("frames", result.frames)
            save_file({name: value.contiguous()}, args.output)
            paths = [args.output]
        else:
            paths = save(result.frames, args.output, s.fps, result.sound, result.sample_rate)
        if result.sound is not None and args.sound_output:
            paths.append(save_wav(result.sound, args.sound_output, result.sample_rate))
        if result.actions is not None:
            paths += save_actions(result.actions, Path(args.output), s.action, s.fps)
        for path in paths:
            print(f"wrote {path}")


def cmd_reason(args) -> None:
    # The options and media are checked (and bad files refused) before any weight is read.
    check_max_new_tokens(args.max_new_tokens)
    Sampling.resolve(args.thinking, args.temperature, args.top_p, args.top_k, args.presence_penalty)
    images = [read_image(path) for path in args.image or []]
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            print("No --checkpoint given: using a tiny RANDOM checkpoint (real layout, meaningless weights); the answer "
                  "is gibberish.", file=sys.stderr)
            args.checkpoint = make_tiny_checkpoint(tmp, kind=args.kind)
        root = resolve(args.checkpoint, components=("transformer", "tokenizer", "reasoner"))
        video = read_clip(args.video, args.sample_fps, root) if args.video else None
        pipe = load(root, device=args.device, dtype=args.dtype, parts="reasoner", offload_text=args.offload_text,
                    quantize=args.quantize)

        def stream(count, total, text, shown=[0]):
            print(text[shown[0] :], end="", flush=True)
            shown[0] = len(text)

        answer = pipe.reason(args.prompt, images=images, video=video, system_prompt=args.system_prompt,
                             max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                             top_k=args.top_k, presence_penalty=args.presence_penalty, seed=args.seed,
                             thinking=args.thinking, callback=None if args.thinking else stream,
                             compile=args.compile)
        if args.thinking:
            print(f"<think>\n{answer.thinking}\n</think>\n\n{answer.text}")
        else:
            print()
        tokens = len(answer.token_ids)
        print(f"{len(answer.prompt_ids)} prompt tokens, {tokens} new ({answer.finish_reason}); prefill "
              f"{answer.prefill_seconds:.2f} s, {tokens / max(answer.decode_seconds, 1e-9):.1f} tokens/s", file=sys.stderr)


def spelled(options: dict) -> str:
    """Request options as the command line's flags."""
    flags = {f.name: cli_flag(f) for f in fields(Request)}
    return " ".join(f"{flags[name]} {value}" for name, value in options.items())


def read_controls(specs: list[str]) -> tuple[dict, float | None]:
    """--control HINT=FILE (the control clip) or HINT:PRESET=FILE (edge or blur derived from the source clip FILE):
    the controls, and the frame rate of the first video file among them (None: no video file says one)."""
    controls, rate = {}, None
    for spec in specs:
        hint, _, path = spec.partition("=")
        hint, _, preset = hint.partition(":")
        if not path or not hint:
            raise InputError(f"--control {spec!r} must be HINT=FILE or HINT:PRESET=FILE (hints {', '.join(HINTS)})")
        check_hints([hint])
        if hint in controls:
            raise InputError(f"--control {hint} is given twice")
        if Path(path).suffix.lower() in IMAGE_TYPES:
            frames = [read_image(path)]
        else:
            frames = read_video(path)
            rate = rate or video_header(path)[1]
        controls[hint] = derive(hint, frames, preset) if preset else frames
    return controls, rate


def read_keyframes(specs: list[str]) -> dict:
    """--keyframe FRAME=FILE (repeatable): {frame: an image, or a clip's frames}."""
    keyframes = {}
    for spec in specs:
        frame, _, path = spec.partition("=")
        try:
            frame = int(frame)
        except ValueError:
            frame = None
        if frame is None or not path:
            raise InputError(f"--keyframe {spec!r} must be FRAME=FILE, e.g. 0=start.png or -1=end.png (an image or a "
                             "video file; negative frames count from the end)")
        if frame in keyframes:
            raise InputError(f"--keyframe {frame} is given twice")
        keyframes[frame] = read_image(path) if Path(path).suffix.lower() in IMAGE_TYPES else read_video(path)
    return keyframes


def low_vram_options(args) -> dict:
    return {"offload_text": args.offload_text, "blocks_to_swap": args.blocks_to_swap, "quantize": args.quantize,
            "transformer_file": args.transformer_file}


def cmd_info(args) -> None:
    """What a checkpoint is, from its config files and weight-file headers only (no weight is read)."""
    checkpoint = Checkpoint(resolve(args.checkpoint, local_files_only=True))
    config = checkpoint.transformer_config()
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
    towers = {"text tower": 0, "media tower": 0, "embeddings and heads": 0}
    for name, p in model.named_parameters():
        towers[tower_of(name)] += p.numel()
    total = sum(towers.values())
    print(f"checkpoint: {checkpoint.root}")
    print(f"variant:    {checkpoint.variant.describe()}")
    print(f"backbone:   hidden {config.hidden_size}, {config.num_hidden_layers} layers, heads "
          f"{config.num_attention_heads} (kv {config.num_key_value_heads}) x {config.head_dim}, "
          f"MLP {config.intermediate_size} ({config.hidden_act}), vocab {config.vocab_size}")
    print(f"parameters: {total / 1e6:,.1f}M used for generation ("
          + ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in towers.items()) + ")")
    print("in memory:  " + ", ".join(f"{name} {total * size / 2**30:,.2f} GiB"
                                     for name, size in (("bf16", 2), ("fp8", 1), ("fp32", 4))))
    weights = detect(checkpoint, args.transformer_file)
    resident = sum(planned_bytes(model, weights, torch.bfloat16).values())
    print(f"weights:    {weights.name}, {resident / 2**30:,.2f} GiB in memory as loaded (what it leaves dense in bf16)")
    if isinstance(weights, GGUF):
        gguf = weights.file
        print(f"on disk:    transformer GGUF {gguf.path.name}: {describe_types(gguf.types())}")
        print(f"gguf:       quantization {gguf.field('cosmos3.quantization') or 'not recorded'}, other tensors in "
              f"{gguf.field('cosmos3.kept_type') or 'their stored types'}; converted from a "
              f"{gguf.field('cosmos3.variant') or 'checkpoint of unrecorded variant'}")
        return
    stored, missing = stored_bytes(checkpoint.path("transformer"))
    files = ", ".join(f"{dtype} {n / 2**30:,.2f} GiB" for dtype, n in sorted(stored.items())) or "none present"
    print(f"on disk:    transformer {files}" + (f"; {len(missing)} weight file(s) missing" if missing else ""))


def cmd_quantize(args) -> None:
    """Convert a checkpoint's transformer to one GGUF file."""

    def progress(done, total):
        print(f"\rquantizing {done / total:6.1%}", end="", file=sys.stderr, flush=True)

    written = convert(args.checkpoint, args.output, args.type, progress=progress)
    print(file=sys.stderr)
    print(f"wrote {args.output}: {describe_types(written)}")
    print(f"load it by putting it alone in the checkpoint's transformer/ folder, or with --transformer-file {args.output}")


def cmd_demo(args) -> None:
    """Load a checkpoint (a tiny random one unless given) and time one transformer forward."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            print("No checkpoint given: building a tiny RANDOM checkpoint (real layout, meaningless weights).")
            args.checkpoint = make_tiny_checkpoint(tmp, kind=args.kind)
        start = time.perf_counter()
        pipe = load(args.checkpoint, device=args.device, dtype=args.dtype, **low_vram_options(args))
        print(f"loaded {pipe.checkpoint.root} in {time.perf_counter() - start:.2f}s")
        print(f"variant: {pipe.variant.describe()}")
        model = pipe.transformer
        (h, w), frames = latent_size(args.height, args.width), latent_frames(args.frames)
        latents = torch.randn(1, model.config.latent_channel, frames, h, w, generator=torch.Generator().manual_seed(0))
        latents = latents.to(pipe.device)
        text = model.encode_text(torch.arange(64) % model.config.vocab_size, pipe.device)
        timestep = torch.tensor(999)
        model(latents, timestep, text)  # warm-up
        if pipe.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        velocity = model(latents, timestep, text).vision
        if pipe.device.type == "cuda":
            torch.cuda.synchronize()
        tokens = frames * -(-h // 2) * -(-w // 2)
        print(f"one transformer forward, {args.width}x{args.height}x{args.frames} ({tokens} media tokens): "
              f"{(time.perf_counter() - start) * 1000:.1f} ms, velocity {tuple(velocity.shape)}")


class Parser(argparse.ArgumentParser):
    """A mistake in the flags as one line that says where the usage is (not the whole usage above it)."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m cosmos3_runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate an image or a video")
    p.add_argument("--checkpoint", help="checkpoint folder or Hugging Face repo id namespace/name (default: a tiny "
                   "random checkpoint)")
    p.add_argument("--kind", choices=KINDS, help="kind of the tiny checkpoint [default: edge; gated for a transfer, "
                   "which Edge does not run, and gated with a sound head for --sound or --audio]")
    p.add_argument("--prompt", required=True, help="prose or a JSON caption")
    p.add_argument("--output", required=True, help="out.png for an image (--frames 1), out.mp4 for a video, "
                   "out.safetensors for the latents")
    add_arguments(p)  # every generation option, from cosmos3_runtime.request.Request
    p.add_argument("--sound-output", help="with --sound or --audio: also write the sound track alone, as a .wav file")
    g = p.add_argument_group("guardrails (the optional cosmos-guardrail package: pip install cosmos-guardrail)")
    g.add_argument("--guardrails", action="store_true", help="check the prompt before anything loads (a keyword "
                   "blocklist and the Qwen3Guard classifier) and the video before it is written (faces pixelated); "
                   "their files come from the Hugging Face cache, fetched once if missing (not with HF_HUB_OFFLINE)")
    g.add_argument("--guardrails-device", default="cpu", help="where the guardrail's models run while they check "
                   "(kept in CPU memory between checks) [default: cpu]")
    g.add_argument("--guardrails-fail-open", action="store_true", help="let a run through when a check itself fails "
                   "(default: such a run is blocked, with the reason)")
    a = p.add_argument_group("action generation (checkpoints with an action head; --image or --video is the "
                             "observation)")
    a.add_argument("--action-mode", choices=MODES, help="policy, forward_dynamics or inverse_dynamics")
    a.add_argument("--domain", default="droid_lerobot", choices=sorted(WIDTHS), help="embodiment [default: droid_lerobot]")
    a.add_argument("--chunk-size", type=int, help="actions per chunk; the video has one more frame (auto: the preset's)")
    a.add_argument("--resolution-tier", type=int, choices=sorted(TIERS), help="action canvas tier (auto: the preset's)")
    a.add_argument("--view-point", choices=sorted(VIEW_POINTS), help="camera of the observation (auto: the preset's)")
    a.add_argument("--preset", choices=list(PRESETS), help="sampling values (auto: droid-server for Policy-DROID "
                   "checkpoints, else framework)")
    a.add_argument("--actions", help="forward_dynamics: the actions to roll out, a table [T, width]: .csv (a row per "
                   "action), .json ([[...], ...]) or .npy, as the Load Actions node reads them")
    a.add_argument("--state", help="droid-server: the robot state, 8 comma-separated values or a .csv / .json / .npy "
                   "file")
    a.add_argument("--action-stats", help="a JSON file of action statistics (q01/q99, mean/std or min/max): "
                   "outputs in the dataset's units")
    p.add_argument("--sp", type=int, default=1, help="sequence-parallel ranks (under torchrun) [default: 1]")
    p.add_argument("--cfg-parallel", action="store_true", help="run the two CFG branches on separate ranks")
    p.set_defaults(run=cmd_generate)
    generate = p

    p = sub.add_parser("reason", help="ask the Reasoner a question about images, a video, or text alone")
    p.add_argument("--checkpoint", help="checkpoint folder or Hugging Face repo id (default: a tiny random checkpoint)")
    p.add_argument("--kind", choices=KINDS, default="gated", help="kind of the tiny checkpoint [default: gated]")
    p.add_argument("--prompt", required=True, help="the question")
    p.add_argument("--image", action="append", help="an image to ask about (repeat for several)")
    p.add_argument("--video", help="a video to ask about")
    p.add_argument("--sample-fps", type=float, help="frames per second of the video to look at (the API's and the "
                   "node's sample_fps; the video's own rate is read from the file) [default: the checkpoint's "
                   "video_preprocessor_config.json; NVIDIA recommends 4]")
    p.add_argument("--system-prompt", help="a system prompt (default: none)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="[default: %(default)s]")
    p.add_argument("--temperature", type=float, help="0 is greedy [default: 0.7, or 0.6 with --thinking]")
    p.add_argument("--top-p", type=float, help="[default: 0.8, or 0.95 with --thinking]")
    p.add_argument("--top-k", type=int, help="[default: 20]")
    p.add_argument("--presence-penalty", type=float, help="[default: 1.5, or 0 with --thinking]")
    p.add_argument("--seed", type=int, default=0, help="[default: 0]")
    p.add_argument("--thinking", action="store_true", help="reason step by step; the thinking is printed first")
    p.add_argument("--compile", action="store_true", help="decode with a torch.compile'd fixed-shape step (CUDA "
                   "graphs on a GPU); the first answer pays the compile")
    p.set_defaults(run=cmd_reason)
    reason = p

    p = sub.add_parser("demo", help="load a checkpoint and time one transformer forward")
    p.add_argument("--checkpoint", help="folder or HF repo id (default: a tiny random checkpoint)")
    p.add_argument("--kind", choices=KINDS, default="edge", help="kind of the tiny checkpoint")
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--frames", type=int, default=9)
    p.set_defaults(run=cmd_demo)

    p = sub.add_parser("info", help="print a checkpoint's variant, shapes and sizes (reads config files only)")
    p.add_argument("checkpoint", help="checkpoint folder or Hugging Face repo id in the local cache")
    p.add_argument("--transformer-file", help="a .gguf file that replaces the transformer's weights")
    p.set_defaults(run=cmd_info)

    p = sub.add_parser("quantize", help="convert a checkpoint's transformer to a GGUF file")
    p.add_argument("checkpoint", help="checkpoint folder (bf16 safetensors) or Hugging Face repo id")
    p.add_argument("output", help="the .gguf file to write")
    p.add_argument("--type", choices=WRITABLE, default="q8_0", help="block type of the transformer blocks' linear "
                   "weights; everything else stays BF16 [default: q8_0]")
    p.set_defaults(run=cmd_quantize)

    p = sub.add_parser("serve-isaaclab", help="serve Isaac Lab's Cosmos cameras: a resident framewise Sim-Transfer "
                       "checkpoint speaking their protocol (docs/causal.md, Isaac Lab)")
    p.add_argument("--checkpoint", required=True, help="a framewise Sim-Transfer checkpoint folder (or a Hugging Face "
                   "repo id already in the local cache: nothing is downloaded)")
    p.add_argument("--endpoint", default=isaaclab.DEFAULT_ENDPOINT, help="unix:///path (a socket only you can open) "
                   "or tcp://127.0.0.1:PORT [default: %(default)s, where Isaac Lab's camera looks]")
    p.add_argument("--allow-remote", action="store_true", help="let a TCP endpoint listen on a non-loopback address "
                   "(the protocol has no authentication: only behind a trusted network or tunnel)")
    p.add_argument("--max-episode-frames", type=int, default=isaaclab.DEFAULT_MAX_EPISODE_FRAMES, help="the longest "
                   "episode a camera may open, 1 + 4k frames; 0: no cap [default: %(default)s, the trained horizon]")
    p.add_argument("--warmup", action="store_true", help="run one episode of blank controls at 832x480 before "
                   "serving, so the first camera does not pay for the first allocations")
    add_arguments(p, SERVICE_OPTIONS)
    p.set_defaults(run=cmd_serve_isaaclab)
    serve = p

    p = sub.add_parser("isaaclab-camera", help="play a control clip through a running serve-isaaclab as Isaac Lab's "
                       "camera does (its first frame, then 4 an update) and save the frames it sends back")
    p.add_argument("--endpoint", default=isaaclab.DEFAULT_ENDPOINT, help="[default: %(default)s]")
    p.add_argument("--control", required=True, help="HINT=FILE: the control clip (edge, depth, seg; blur: the "
                   "camera's RGB, which the service blurs), or HINT:PRESET=FILE (edge derived from a source clip); "
                   "at its own size, 1 + 4k frames used")
    p.add_argument("--prompt", help="the scene's appearance (default: none)")
    p.add_argument("--seed", type=int, default=0, help="[default: 0]")
    p.add_argument("--output", required=True, help="the generated clip: out.mp4")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the service to come up "
                   "[default: %(default)s]")
    p.add_argument("--shutdown", action="store_true", help="stop the service afterwards")
    p.set_defaults(run=cmd_isaaclab_camera)

    for loading in (generate, reason, sub.choices["demo"], serve):
        loading.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
        loading.add_argument("--dtype", default=None, help="auto, bf16, fp16, fp32 (default: bf16 on GPU, fp32 on CPU)")
        loading.add_argument("--offload-text", action="store_true", help="keep the text tower in CPU memory except "
                             "while a prompt is encoded (bit-identical)")
        loading.add_argument("--quantize", choices=["fp8", "fp8_scaled"], default=None, help="store the transformer's "
                             "weights as fp8 with per-channel scales (about half the memory); fp8_scaled also runs "
                             "the media blocks' matmuls in fp8 (compute capability 9.0+, larger error)")
    for loading in (generate, sub.choices["demo"], serve):
        loading.add_argument("--blocks-to-swap", type=int, default=0, help="stream this many layers from CPU memory "
                             "during each forward (bit-identical) [default: 0]")
        loading.add_argument("--transformer-file", help="a .gguf file to load the transformer's weights from (a "
                             "single .gguf in transformer/ is found without it)")
    generate.add_argument("--vae-dtype", default=None, help="the VAE's precision: bf16, fp32 ... (default: --dtype's; "
                          "fp32 holds 1.4 GB more; a bf16 decode is within about 55 dB PSNR of it)")

    p = sub.add_parser("make-tiny", help="write a tiny random checkpoint in the released layout (meaningless "
                       "weights: for trying the pack and its tests without a download)")
    p.add_argument("folder")
    p.add_argument("--kind", choices=KINDS, default="edge", help="edge (Cosmos3-Edge's layout, what generate uses "
                   "without --checkpoint) or gated (Nano / Super's, which transfer and sound need) [default: edge]")
    p.add_argument("--sound", action="store_true", help="with a sound head and a sound tokenizer (as Nano)")
    p.add_argument("--action", action="store_true", help="with an action head (as Edge, Nano, Policy-DROID)")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--distilled", action="store_true")
    p.add_argument("--sim-transfer", action="store_true", help="Cosmos3-Nano-Sim-Transfer's layout: a causal gated "
                   "checkpoint that rolls a video out chunk by chunk from a caption and one control clip")
    p.add_argument("--sim-bimanual", action="store_true", help="Cosmos3-Nano-Sim-Bimanual's layout: a causal gated "
                   "checkpoint that rolls a robot video out from a first image and actions (AgiBot 29 values, or a "
                   "9-value camera pose)")
    p.add_argument("--framewise", action="store_true", help="with --sim-transfer: framewise, one latent frame a chunk "
                   "(4 frames, what Isaac Lab's camera sends an update), a 30-frame history window with 3 sinks")
    p.set_defaults(run=cmd_make_tiny)

    for command in sub.choices.values():
        command.add_argument("--debug", action="store_true", help="show the traceback of errors")
    parser.commands = sub.choices
    return parser


def flag_names(command: argparse.ArgumentParser) -> dict[str, str]:
    """The API names (`generate` / `load` arguments) behind a command's flags -> the flags, for its error messages."""
    return {action.dest: action.option_strings[0] for action in command._actions
            if action.option_strings and "_" in action.dest}


def main(argv=None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    command = parser.commands[args.command]
    if unknown:  # in the subcommand's words, not the top level's
        near = difflib.get_close_matches(unknown[0], [o for a in command._actions for o in a.option_strings], n=1,
                                     cutoff=0.8)
        command.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" (did you mean {near[0]}?)" if near else ""))
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)  # settings notes, load warnings
    try:
        args.run(args)
    except Cosmos3Error as exc:  # a problem the user can fix: one line in the CLI's words, no traceback
        if args.debug:
            raise
        print(f"error: {reworded(str(exc), flag_names(command))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
