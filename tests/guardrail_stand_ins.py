"""What the cosmos-guardrail package loads, stood in for, so its own classes run here on the CPU without a network:

- its files, in a Hugging Face cache of the tests' own: a blocklist with the tests' own words (`WORDS`), a face
  detector file that is never read, the classifier's folder;
- its two models: the Qwen3Guard classifier with its tokenizer (`Classifier`, `Tokenizer`: the answer is scripted
  from the prompt) and RetinaFace (`Detector`: one face where `FACE` is, every frame);
- nltk's tokenizer and lemmatizer data (not downloadable here): splitting on spaces, a trailing "s" dropped;
- the two torchvision names RetinaFace's module imports: the registry's torchvision is a CUDA build that cannot load
  beside the CPU torch, and the stand-in detector needs neither.
"""

import importlib.machinery
import sys
import types
from pathlib import Path

import torch

WORDS = {"custom": ["zorblat"], "exact_match": ["quuxhammer"], "whitelist": []}  # the tests' blocklist
UNSAFE, GARBLED = "arson", "garbled"  # prompts with these words get "Safety: Unsafe" / an unreadable answer
FACE = (48, 32, 80, 64)  # x1, y1, x2, y2 of the face the stand-in detector finds (pixels of a 128x96 frame)


def stub_torchvision(monkeypatch) -> None:
    """Make the package's module importable beside a CPU torch, for one test: the torchvision names RetinaFace's module
    imports are stubs where torchvision cannot load (the stand-in detector replaces the network they build)."""
    import transformers  # noqa: F401 - it decides now, without the stubs, that torchvision is not there
    from transformers import AutoModelForCausalLM, AutoTokenizer, SiglipModel, SiglipProcessor  # noqa: F401

    try:
        import torchvision.models._utils  # noqa: F401
        return
    except Exception:  # noqa: BLE001 - missing, or the CUDA build failing to load its operators
        pass
    stubs = {}
    for name in ("torchvision", "torchvision.models", "torchvision.models._utils"):
        stubs[name] = types.ModuleType(name)
        stubs[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, stubs[name])
    stubs["torchvision"].models, stubs["torchvision.models"]._utils = stubs["torchvision.models"], stubs[
        "torchvision.models._utils"]


def hf_cache(root: Path) -> Path:
    """A Hugging Face cache holding the guardrail's repo (blocklist, face detector file) and the classifier's."""
    from cosmos3_runtime.guardrails import CLASSIFIER_REPO, GUARDRAIL_REPO

    for repo, files in ((GUARDRAIL_REPO, {**{f"blocklist/{kind}/words.txt": "\n".join(words)
                                             for kind, words in WORDS.items()},
                                          "blocklist/nltk_data/README": "stand-in", "face_blur_filter/Resnet50_Final.pth":
                                          "never read: the stand-in detector has no weights"}),
                        (CLASSIFIER_REPO, {"config.json": "{}"})):
        folder = root / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text("0" * 40)
        for name, text in files.items():
            path = folder / "snapshots" / ("0" * 40) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


class Tokenizer:
    """Qwen3Guard's tokenizer as its code uses it; it remembers the prompt, and decodes the classifier's answer."""

    def __init__(self):
        self.prompt = ""

    def apply_chat_template(self, messages, tokenize=False):
        return messages[0]["content"]

    def __call__(self, texts, return_tensors="pt"):
        self.prompt = texts[0]
        return _Encoding(torch.zeros(1, len(self.prompt.split()) + 1, dtype=torch.long))

    def decode(self, ids, skip_special_tokens=True):
        if GARBLED in self.prompt:
            return "I cannot tell."
        return "Safety: Unsafe\nCategories: Violent" if UNSAFE in self.prompt else "Safety: Safe\nCategories: None"


class _Encoding(dict):
    def __init__(self, input_ids):
        super().__init__(input_ids=input_ids)
        self.input_ids = input_ids

    def to(self, device):
        return self


class Classifier(torch.nn.Module):
    """Qwen3Guard-Gen as its code uses it: `generate` appends the answer's tokens (a weight, so it moves and counts)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(8))
        self.generated = 0

    @property
    def device(self):
        return self.weight.device

    def generate(self, input_ids, max_new_tokens, **_):
        self.generated += 1
        return torch.cat([input_ids, torch.ones(1, 6, dtype=torch.long)], dim=1)


class Detector(torch.nn.Module):
    """RetinaFace (test phase) as the package's filter calls it: (locations, confidences, landmarks) per prior. The
    prior of 32 px nearest the centre of `FACE` gets a face score of 0.99 and no offset, so the face found is that
    prior's box."""

    def __init__(self, cfg, phase="test"):
        super().__init__()
        self.cfg = cfg
        self.weight = torch.nn.Parameter(torch.ones(1))

    def forward(self, batch):
        from retinaface.layers.functions.prior_box import PriorBox

        h, w = batch.shape[-2:]
        priors = PriorBox(self.cfg, image_size=(h, w)).forward()
        centre = torch.tensor([(FACE[0] + FACE[2]) / 2 / w, (FACE[1] + FACE[3]) / 2 / h])
        distance = (priors[:, :2] - centre).norm(dim=1) + (priors[:, 2] * w - 32).abs()
        confidence = torch.zeros(batch.shape[0], len(priors), 2)
        confidence[..., 0] = 1.0
        confidence[:, distance.argmin()] = torch.tensor([0.01, 0.99])
        locations = torch.zeros(batch.shape[0], len(priors), 4) * self.weight
        return locations, confidence, torch.zeros(batch.shape[0], len(priors), 10)


def install(checker, monkeypatch) -> Classifier:
    """The stand-ins in the package's module (and nltk's): what its classes load is the tests'. Returns the classifier
    stand-in, for counting its calls."""
    classifier = Classifier()
    monkeypatch.setattr(checker, "AutoModelForCausalLM", types.SimpleNamespace(from_pretrained=lambda *_: classifier))
    monkeypatch.setattr(checker, "AutoTokenizer", types.SimpleNamespace(from_pretrained=lambda *_: Tokenizer()))
    monkeypatch.setattr(checker, "RetinaFace", Detector)
    monkeypatch.setattr(checker, "load_model", lambda net, path: net)
    monkeypatch.setattr(checker.nltk, "word_tokenize", str.split)
    monkeypatch.setattr(checker.nltk, "WordNetLemmatizer",
                        lambda: types.SimpleNamespace(lemmatize=lambda word: word[:-1] if word.endswith("s") else word))
    return classifier
