"""Named deployment recipes and GPU hardware facts, loaded from spectool's YAML data files.

Why: the memory estimate and the cost model need a GPU's memory, bandwidth and peak tensor
throughput, and users want to name a documented target/drafter pair (``llama-3.1-8b-eagle3``)
instead of spelling out two repo ids, a method and a draft length. The facts live in YAML files
with their sources in comments, one file per GPU (``gpus/<stem>.yaml``) and one per recipe
(``<name>.yaml``); this module validates them (pydantic, ``extra="forbid"``) and answers lookups.

Where the files are: installed, in the data package ``spectool.profile_data`` (built from the
repository's top-level ``profiles/`` folder); in a source checkout that is not installed, that
``profiles/`` folder itself. Every loader also takes an explicit folder, for tests and for users'
own tables.

Names match case-insensitively, ignoring spaces, dashes and underscores, and the vendor words
"NVIDIA", "GeForce" and "Tesla" (so ``H100 SXM``, ``h100_sxm`` and ``NVIDIA H100 80GB HBM3`` all
name the same GPU).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from spectool import methods
from spectool.errors import ProfileError
from spectool.predict.geometry import GeometrySpec
from spectool.suggest import suggestion

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    Folder = Path | Traversable

# The installed data package; pyproject maps the repository's ``profiles/`` folder onto it.
DATA_PACKAGE = "spectool.profile_data"
# Where that folder sits in a source checkout that is not installed.
_CHECKOUT_PROFILES = Path(__file__).resolve().parent.parent / "profiles"

# The method names and which take no drafter come from spectool.methods.
METHODS: tuple[str, ...] = methods.METHODS
METHODS_WITHOUT_DRAFTER: frozenset[str] = methods.METHODS_WITHOUT_DRAFTER

_VENDOR_WORDS = frozenset({"nvidia", "geforce", "tesla"})
# A Hugging Face repo id ("owner/name") or one of spectool's embedded models ("spectool:name").
_MODEL_REF = re.compile(r"^(?:[A-Za-z0-9][\w.\-]*/[\w.\-]+|spectool:[\w.\-]+)$")
# A URL, an ``owner/repo:path`` reference, or a path inside spectool itself.
_SOURCE_REF = re.compile(r"^(?:https?://\S+|[\w.\-]+/[\w.\-]+:\S+|spectool:\S+)$")


def normalize_name(name: str) -> str:
    """The matching key of a GPU or profile name: lowercase, vendor words dropped, no separators.

    >>> normalize_name("NVIDIA GeForce RTX 4090")
    'rtx4090'
    >>> normalize_name("H100_SXM")
    'h100sxm'
    """
    words = [w for w in re.split(r"[\s\-_]+", name.strip().lower()) if w]
    kept = [w for w in words if w not in _VENDOR_WORDS]
    return "".join(kept or words)


class GpuSpec(BaseModel):
    """Published facts about one GPU, from ``gpus/<stem>.yaml``.

    Units: ``memory_gib`` is the marketed capacity read as GiB (what nvidia-smi reports is a
    little less); ``hbm_bandwidth_gbs`` is device-memory bandwidth in GB/s (1e9 bytes/s), HBM or
    GDDR; throughputs are dense (no 2:4 sparsity) tensor-core TFLOP/s (1e12 FLOP/s).
    ``fp8_dense_tflops`` is None where the GPU has no FP8 tensor cores (Ampere).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    sm: int = Field(ge=70, le=200, description="compute capability major*10+minor, e.g. 90")
    memory_gib: float = Field(gt=0)
    hbm_bandwidth_gbs: float = Field(gt=0)
    bf16_dense_tflops: float = Field(gt=0)
    fp8_dense_tflops: float | None = Field(default=..., gt=0)

    @property
    def memory_bytes(self) -> int:
        """Marketed device memory in bytes (``memory_gib`` * 2**30)."""
        return int(self.memory_gib * 2**30)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Device-memory bandwidth in bytes per second."""
        return self.hbm_bandwidth_gbs * 1e9

    def match_keys(self) -> frozenset[str]:
        """Every normalized name this GPU answers to (its name and aliases; the loader adds the
        file stem)."""
        return frozenset(normalize_name(n) for n in (self.name, *self.aliases))


def _known_method(value: str) -> str:
    """A method name of spectool.methods (pydantic validator body)."""
    if not methods.is_method(value):
        raise ValueError(f"unknown method {value!r}; expected one of {', '.join(METHODS)}")
    return value


def _model_ref(value: str) -> str:
    if not _MODEL_REF.match(value):
        raise ValueError(f"{value!r} is not a repo id 'owner/name' or 'spectool:<name>'")
    return value


def _source_ref(value: str) -> str:
    if not _SOURCE_REF.match(value):
        raise ValueError(f"{value!r} is not a URL or an 'owner/repo:path' reference")
    return value


# Field types of the recipe files, each checked where it is declared.
MethodName = Annotated[str, AfterValidator(_known_method)]
ModelRef = Annotated[str, AfterValidator(_model_ref)]
SourceRef = Annotated[str, AfterValidator(_source_ref)]


def _check_drafter_for_method(method: str, drafter: str | None) -> None:
    if method in METHODS_WITHOUT_DRAFTER and drafter is not None:
        raise ValueError(f"method {method} takes no drafter (drafter: null)")
    if method not in METHODS_WITHOUT_DRAFTER and drafter is None:
        raise ValueError(f"method {method} needs a drafter repo id")


class Alternative(BaseModel):
    """Another method for a recipe's target (``alternatives:``), compared by ``spectool tune``
    with the recipe's own (:mod:`spectool.tuning.compare`). ``max_draft_len`` None: the
    recipe's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: MethodName
    drafter: ModelRef | None = None
    max_draft_len: int | None = Field(default=None, ge=1, le=64)

    @model_validator(mode="after")
    def _drafter_matches_method(self) -> Alternative:
        _check_drafter_for_method(self.method, self.drafter)
        return self


class ProfileGeometry(BaseModel):
    """Sizes of the pair for offline prediction (``geometry:``): what
    :func:`spectool.predict.geometry_from_mapping` reads, for the target and (methods with a
    drafter) the drafter, and where the numbers were read (``source``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1)
    target: GeometrySpec
    drafter: GeometrySpec | None = None


class PublishedAcceptance(BaseModel):
    """A published acceptance figure for the pair (``acceptance:``), with its source.

    Exactly one of ``length`` (mean tokens per step, bonus included, measured at
    ``draft_len``), ``rate`` (per-draft-token acceptance) or ``per_position`` (conditional
    acceptance of draft positions 1..n).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    length: float | None = Field(default=None, ge=1.0)
    rate: float | None = Field(default=None, ge=0.0, le=1.0)
    per_position: tuple[float, ...] | None = None
    draft_len: int | None = Field(default=None, ge=1, le=64)
    source: SourceRef
    notes: str = Field(min_length=1)

    @model_validator(mode="after")
    def _one_figure(self) -> PublishedAcceptance:
        given = [n for n in ("length", "rate", "per_position") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of length, rate or per_position")
        if self.length is not None:
            if self.draft_len is None:
                raise ValueError("length needs the draft_len it was measured at")
            if self.length > self.draft_len + 1:
                raise ValueError(f"length {self.length} exceeds draft_len + 1")
        if self.per_position is not None:
            if not self.per_position or any(not 0 <= a <= 1 for a in self.per_position):
                raise ValueError("per_position values must lie in [0, 1]")
            if self.draft_len is not None and self.draft_len != len(self.per_position):
                raise ValueError("draft_len differs from the number of per_position values")
        return self

    def to_acceptance(self):  # noqa: ANN201 - spectool.predict.Acceptance
        """The figure as the step-cost model takes it, its source named."""
        from spectool.predict.acceptance import Acceptance

        source = f"published: {self.source}"
        if self.length is not None:
            assert self.draft_len is not None
            return Acceptance.from_length(self.length, self.draft_len, source)
        if self.rate is not None:
            return Acceptance.from_rate(self.rate, source)
        assert self.per_position is not None
        return Acceptance.from_alphas(self.per_position, source)


class Recipe(BaseModel):
    """A named, documented target/drafter pair, from ``<name>.yaml``.

    ``target`` and ``drafter`` are Hugging Face repo ids, or ``spectool:<name>`` for spectool's
    embedded models. ``drafter`` is None exactly for ``mtp`` (the target's own MTP layers) and
    ``ngram`` (drafts from the prompt). ``max_draft_len`` is the number of tokens drafted per
    step (for mtp: MTP steps), at least 1 for every method. ``source`` points at the document
    that uses this pair: a URL or ``owner/repo:path``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    target: ModelRef
    drafter: ModelRef | None
    method: MethodName
    max_draft_len: int = Field(ge=1, le=64)
    notes: str = Field(min_length=1)
    source: SourceRef
    alternatives: tuple[Alternative, ...] = ()
    geometry: ProfileGeometry | None = None
    acceptance: PublishedAcceptance | None = None

    @model_validator(mode="after")
    def _drafter_matches_method(self) -> Recipe:
        _check_drafter_for_method(self.method, self.drafter)
        listed = [self.method, *(a.method for a in self.alternatives)]
        if len(set(listed)) != len(listed):
            raise ValueError(f"alternatives repeat a method: {', '.join(listed)}")
        if self.geometry is not None:
            if self.method in methods.DRAFTER_GEOMETRY_METHODS and self.geometry.drafter is None:
                raise ValueError(f"geometry: method {self.method} needs the drafter's geometry")
            if self.drafter is None and self.geometry.drafter is not None:
                raise ValueError("geometry: drafter given but the recipe has no drafter")
        return self


# ---------------------------------------------------------------------------------- files


def profiles_root() -> Folder:
    """The folder holding the recipe files (GPU files are in its ``gpus`` subfolder).

    A source checkout's own ``profiles/`` wins over the data package: an editable install of
    another checkout (a git worktree sharing its venv) must not answer for this one."""
    if _CHECKOUT_PROFILES.is_dir():
        return _CHECKOUT_PROFILES
    try:
        return importlib.resources.files(DATA_PACKAGE)
    except ModuleNotFoundError:
        return _CHECKOUT_PROFILES


def _yaml_files(folder: Folder) -> Iterator[Traversable]:
    """The ``*.yaml`` files directly in ``folder``, sorted by name."""
    if not folder.is_dir():
        raise ProfileError(str(folder), "profile folder not found")
    files = [f for f in folder.iterdir() if f.name.endswith(".yaml") and f.is_file()]
    yield from sorted(files, key=lambda f: f.name)


def _read_mapping(file: Traversable) -> dict[str, object]:
    """Parse one YAML file that must hold a mapping; errors name the file."""
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(str(file), f"malformed YAML: {' '.join(str(exc).split())}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(str(file), f"cannot read: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(str(file), f"expected a mapping of keys, got {type(data).__name__}")
    return data


def _validation_problem(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "file"
        parts.append(f"{where}: {err['msg']}")
    return "invalid profile: " + "; ".join(parts)


def _stem(file: Traversable) -> str:
    return file.name[: -len(".yaml")]


def load_gpu_table(folder: Folder | None = None) -> dict[str, GpuSpec]:
    """Read and validate every ``*.yaml`` GPU file in ``folder`` (default: spectool's own).

    Returns file stem -> spec. Raises ProfileError naming the file for malformed YAML or
    invalid keys, and for a name or alias that two files both claim.
    """
    folder = profiles_root().joinpath("gpus") if folder is None else folder
    table: dict[str, GpuSpec] = {}
    owner: dict[str, str] = {}
    for file in _yaml_files(folder):
        stem = _stem(file)
        try:
            spec = GpuSpec.model_validate(_read_mapping(file))
        except ValidationError as exc:
            raise ProfileError(str(file), _validation_problem(exc)) from exc
        for key in spec.match_keys() | {normalize_name(stem)}:
            if key in owner and owner[key] != stem:
                raise ProfileError(str(file), f"name {key!r} is already used by {owner[key]}.yaml")
            owner[key] = stem
        table[stem] = spec
    return table


def load_recipe_table(folder: Folder | None = None) -> dict[str, Recipe]:
    """Read and validate every ``*.yaml`` recipe file in ``folder`` (default: spectool's own).

    Returns name -> recipe. A recipe's ``name`` must equal its file stem. Raises ProfileError
    naming the file for malformed YAML or invalid keys.
    """
    folder = profiles_root() if folder is None else folder
    table: dict[str, Recipe] = {}
    for file in _yaml_files(folder):
        try:
            recipe = Recipe.model_validate(_read_mapping(file))
        except ValidationError as exc:
            raise ProfileError(str(file), _validation_problem(exc)) from exc
        if recipe.name != _stem(file):
            raise ProfileError(str(file), f"name {recipe.name!r} differs from the file name")
        table[recipe.name] = recipe
    return table


@functools.cache
def _gpu_table() -> dict[str, GpuSpec]:
    return load_gpu_table()


@functools.cache
def _gpu_index() -> dict[str, GpuSpec]:
    """Normalized name, alias or stem -> spec, for spectool's own table."""
    index: dict[str, GpuSpec] = {}
    for stem, spec in _gpu_table().items():
        for key in spec.match_keys() | {normalize_name(stem)}:
            index[key] = spec
    return index


@functools.cache
def _recipe_table() -> dict[str, Recipe]:
    return load_recipe_table()


@functools.cache
def _recipe_index() -> dict[str, Recipe]:
    return {normalize_name(name): recipe for name, recipe in _recipe_table().items()}


# ---------------------------------------------------------------------------------- lookups


def list_gpus() -> list[str]:
    """The file stems of spectool's GPU table, sorted (``a100-40gb``, ``h100-sxm``, ...)."""
    return sorted(_gpu_table())


def load_gpu(name: str) -> GpuSpec:
    """The GPU named ``name``: a file stem, its ``name`` or an alias, matched loosely.

    Raises ProfileError listing the known GPUs when nothing matches.
    """
    spec = _gpu_index().get(normalize_name(name))
    if spec is None:
        known = list_gpus()
        hint = suggestion(name, known, key=normalize_name)
        raise ProfileError(None, f"unknown GPU {name!r}{hint}; known: {', '.join(known)}")
    return spec


def gpu_for_device_name(device_name: str) -> GpuSpec | None:
    """The spec for a device name as NVML or nvidia-smi reports it, or None when unknown.

    Matches only whole names (after normalization), never prefixes: "NVIDIA H100 NVL" or
    "NVIDIA L40" have different memory and bandwidth than "H100" or "L4", so guessing would
    feed wrong figures to the cost model. Unknown devices need ``--gpu``.
    """
    return _gpu_index().get(normalize_name(device_name))


def list_profiles() -> list[str]:
    """The names of spectool's recipes, sorted."""
    return sorted(_recipe_table())


def load_profile(name: str) -> Recipe:
    """The recipe named ``name`` (case and ``-``/``_`` insensitive).

    Raises ProfileError listing the known profiles when nothing matches.
    """
    recipe = _recipe_index().get(normalize_name(name))
    if recipe is None:
        known = list_profiles()
        hint = suggestion(name, known, key=normalize_name)
        raise ProfileError(None, f"unknown profile {name!r}{hint}; known: {', '.join(known)}")
    return recipe


def is_profile_name(s: str) -> bool:
    """Whether ``s`` names one of spectool's recipes (repo ids and paths never do: they hold a
    ``/``)."""
    if "/" in s or "\\" in s:
        return False
    return normalize_name(s) in _recipe_index()
