"""AOTInductor as an inference engine of relmt (issue 33): the network compiled ahead of time into native code by
PyTorch's own compiler, the search relmt's.

`export_aoti(model, dir)` captures the graphs of relmt/export/graphs.py with `torch.export` (dynamic batch, beam,
source and target lengths) and compiles each with `torch._inductor.aoti_compile_and_package` into encoder.pt2,
step.pt2 and search.pt2 (the step with the beam search's own step: one call per step, issue 44 §7), and the search
graph again for steps of few rows (search_small.pt2, SMALL_ROWS), beside aoti.json (the shapes the engine needs).
`AotiModel` loads them with `torch._inductor.aoti_load_package` and runs them as a `GraphModel`, so every search and
decoding option works on top of it (an export without search.pt2, made before it existed, runs the search step in
Python). The compile needs a C++ compiler (g++ or clang++) and takes a few minutes in all (3 at the first
engine=aoti use of issue 74 §4); a log line says which graph it compiles, and another how
long it took, and inductor's own report of each autotuned GEMM ("Autotune Choices Stats", written to stderr) is
turned off (QUIET). The packages then run in any process with the same torch version, on the threads torch is
given.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

from relmt.errors import UserError
from relmt.export import graphs
from relmt.export.aoti_loop import body_constants
from relmt.export.graphs import (
    EncoderGraph,
    GraphModel,
    LoopGraph,
    SearchGraph,
    StepGraph,
    examples,
    loop_examples,
    search_examples,
    shape_of,
)
from relmt.model.transformer import Transformer

log = logging.getLogger(__name__)

FILES = ("encoder.pt2", "step.pt2", "aoti.json")  # and search.pt2 and search_small.pt2, where the export has them
AOTI_VERSION = 7  # 2: search_small.pt2; 3: kernels split for the machine's cores (`compile_threads`); 4: MIN_CHUNK;
# 5: the graphs for many rows traced at many rows (relmt.export.graphs.EXAMPLE_SIZES); 6: int8's search_small.pt2;
# 7: loop.pt2, the whole search in one call (relmt/export/aoti_loop.py)
# (a change makes a new artefact: relmt/export/engines.py's dependencies)
# At a few rows (sentences x beams) a step's GEMMs are the library calls of oneDNN's prepacked products, and
# inductor's own C++ GEMM template, autotuned at the examples' 6 rows (graphs.examples), runs them faster; at more
# rows it is slower. search_small.pt2 is the search graph compiled so, run up to SMALL_ROWS rows: one sentence at
# beam 4 (docs/results/engines/aoti_small_rows.md: faster at one sentence, slower from two). An int8 export compiles
# it too, traced at few rows but without the template (it takes no int8 operands): search.pt2, traced at many rows
# since AOTI_VERSION 5, splits a step's small loops over the threads, which costs one sentence more than it gives.
SMALL_ROWS = 4
SMALL_CONFIGS = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN", "autotune_num_choices_displayed": 0}
# Inductor writes each autotuned GEMM's choices and timings to stderr as a JSON blob after "Autotune Choices Stats:"
# (torch/_inductor/select_algorithm.py, _log_autotune_choices_stats) unless this config is off: noise to a user.
QUIET = {"max_autotune_report_choices_stats": False}


def check_compiler() -> str:
    """The C++ compiler inductor will use, or a UserError saying how to get one."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        return get_cpp_compiler()
    except Exception as e:  # inductor raises its own error types, which differ between versions
        raise UserError(f"engine=aoti compiles the model with a C++ compiler, and none was found ({e}): install "
                        "g++ or clang++, or set CXX, or use engine=onnx") from None


# Inductor splits a loop over the threads only where each gets at least this many elements (its cpp.min_chunk_size,
# 512 by default). At one sentence a step's elementwise kernels are a few thousand elements each, and splitting them
# costs OpenMP's fork and join: at 4,096 one sentence at a time decodes 1.3-1.4x faster on one thread, and at 2
# threads within the runs' noise (1.1x in docs/results/engines/one_sentence_variants_amd_epyc.md, 0.96x in
# one_sentence_amd_epyc.md); at 32 sentences per batch a kernel is still split. 16,384 was slower at 2 threads
# (one_sentence_chunk16384_amd_epyc.json).
MIN_CHUNK = 4096


def compile_threads() -> int:
    """The threads the compiled kernels are split for: the cores this process may run on. Inductor otherwise takes
    the compiling process's torch threads, and a package compiled in a one-thread process (relmt-translate with
    one thread, a test worker) has no parallel loop at all, so that a second thread later speeds up its GEMMs
    alone (docs/results/engines/one_sentence_amd_epyc.md). A loop is split only where each thread gets enough work
    (inductor's cpp.min_chunk_size), so a process given fewer threads runs the same code."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def compile_graph(module: torch.nn.Module, args: tuple, dims, path: str | Path, configs: dict | None = None) -> float:
    """`module` exported (dynamic in `dims`) and compiled by AOTInductor into the package `path` as engine=aoti
    compiles its graphs, `configs` besides; the seconds it took. Freezing makes the weights constants, prepacked for
    oneDNN's GEMMs (1.5x faster decoder steps at 32 sentences per batch on a CPU; docs/results/engines/engines_cpu.md),
    and the kernels are split for the machine's cores where each thread gets MIN_CHUNK elements."""
    start = time.perf_counter()
    program = torch.export.export(module, args, dynamic_shapes=dims)
    torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs={
        "freezing": True, "cpp.threads": compile_threads(), "cpp.min_chunk_size": MIN_CHUNK, **QUIET,
        **(configs or {})})
    return time.perf_counter() - start


@torch.no_grad()
def export_aoti(model: Transformer, directory: str | Path, quantization: str = "float32",
                kept_in: str | Path | None = None) -> Path:
    """Compile encoder.pt2, step.pt2, search.pt2, search_small.pt2 and (float32) loop.pt2, the whole
    search in one call (relmt/export/aoti_loop.py), and write aoti.json into `directory`; with
    quantization=int8, of a copy with int8 linear maps (relmt/export/quantize.py), its search_small.pt2 without
    inductor's GEMM template (which autotunes float32 products; an int8 one stays an `_int_mm`). A log line
    (WARNING: the CLIs show no INFO) before each graph names it and where the packages are kept (`kept_in`: the folder
    `directory` becomes, where it is a build folder; default `directory`), and one after it its time."""
    check_compiler()
    directory = Path(directory)
    kept_in = Path(kept_in) if kept_in is not None else directory
    directory.mkdir(parents=True, exist_ok=True)
    model = model.float().cpu().eval()
    if quantization == "int8":
        from relmt.export.quantize import int8_copy

        model = int8_copy(model)
    elif quantization != "float32":
        raise UserError(f"quantization={quantization}: engine=aoti compiles float32 or int8 weights")
    # traced at many rows, so that inductor splits a batch's loops over the threads (graphs.EXAMPLE_SIZES), and
    # search_small.pt2 at few (the rows its GEMM template is autotuned at, and one sentence's)
    src, step, encoder_dims, step_dims = examples(model, "many")
    search, search_dims = search_examples(model, "many")
    todo = [("encoder", EncoderGraph(model), src, encoder_dims, {}), ("step", StepGraph(model), step, step_dims, {}),
            ("search", SearchGraph(model), search, search_dims, {}),
            ("search_small", SearchGraph(model), *search_examples(model, "few"),
             SMALL_CONFIGS if quantization == "float32" else {})]
    # the whole search in one call, for a sentence at a time (AotiModel.loop_rows), as search_small.pt2; not int8's:
    # Dynamo's while_loop takes no tensor subclass as an operand (torchao's int8 weights: "get_tensor_storages does
    # not support traceable wrapper subclasses", torch 2.13)
    if quantization == "float32":
        todo.append(("loop", LoopGraph(model), *loop_examples(model), SMALL_CONFIGS))
    began = time.perf_counter()
    with warnings.catch_warnings():  # the compiler's deprecation chatter is not the user's business
        warnings.simplefilter("ignore")
        for number, (name, module, args, dims, configs) in enumerate(todo, 1):
            log.warning("engine=aoti: compiling the %s graph (%d of %d; a few minutes in all, done once: the "
                        "packages are kept in %s)", name, number, len(todo), kept_in)
            tmp = directory / f".{name}.part.pt2"  # inductor wants the .pt2 suffix
            with body_constants() if name == "loop" else contextlib.nullcontext():
                seconds = compile_graph(module, args, dims, tmp, configs)
            os.replace(tmp, directory / f"{name}.pt2")
            log.warning("engine=aoti: compiled the %s graph in %.0f s", name, seconds)
    log.warning("engine=aoti: compiled %d graphs in %.1f minutes", len(todo), (time.perf_counter() - began) / 60)
    meta = shape_of(model) | {"torch": torch.__version__, "graphs": graphs.GRAPHS_VERSION, "quantization": quantization,
                              "threads": compile_threads()}
    (directory / "aoti.json").write_text(json.dumps(meta, indent=2) + "\n")
    return directory


AGAIN = ("export it again with this relmt (relmt-export format=aoti; engine=aoti builds its own artefact anew once "
         "the old folder is removed)")


def graphs_version(directory: Path, meta: dict) -> int | None:
    """The GRAPHS_VERSION of relmt's graphs an export was compiled from: aoti.json's "graphs" (exports since it was
    recorded there), else the "relmt graphs" of an engine artefact's record (relmt/export/engines.py), else None."""
    version = meta.get("graphs")
    if version is None:
        try:
            version = json.loads((directory / "relmt_artefact.json").read_text()).get("relmt graphs")
        except (OSError, ValueError, AttributeError):
            return None
    try:
        return int(version)
    except (TypeError, ValueError):
        return None


class AotiModel(GraphModel):
    """Compiled packages loaded in this process, with the interface the searches use of a Transformer. An export
    of other graphs than this relmt's is refused as it loads (a compiled model given another number of inputs than
    it takes would fail at the first step): by the graphs' version it records, and where it records none (exports
    made before aoti.json held it) by the inputs and outputs its packages take and give."""

    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        missing = [f for f in FILES if not (directory / f).is_file()]
        if missing:
            raise UserError(f"{directory}: not an AOTInductor export of relmt (missing {', '.join(missing)})")
        meta = json.loads((directory / "aoti.json").read_text())
        if meta.get("torch") != torch.__version__:
            raise UserError(f"{directory}: compiled with torch {meta.get('torch')}, and this is torch "
                            f"{torch.__version__}: export it again (relmt-export format=aoti)")
        version = graphs_version(directory, meta)
        if version is not None and version != graphs.GRAPHS_VERSION:
            raise UserError(f"{directory}: compiled from version {version} of relmt's graphs, and this relmt's are "
                            f"version {graphs.GRAPHS_VERSION} (relmt/export/graphs.py: GRAPHS_VERSION): {AGAIN}")
        super().__init__(meta)
        names = ["encoder", "step"] + (["search"] if (directory / "search.pt2").is_file() else [])
        names += ["search_small"] if names[-1] == "search" and (directory / "search_small.pt2").is_file() else []
        names += ["loop"] if "search_small" in names and (directory / "loop.pt2").is_file() else []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calls = {name: flat_call(directory / f"{name}.pt2") for name in names}
        # (inputs, outputs) of relmt's graphs; an export without starts (made before them): its step graph takes none
        cache = 2 * self.layers - 2  # self_k and self_v, one input (and output) per layer each
        search = len(graphs.SEARCH_INPUTS) + cache, len(graphs.SEARCH_OUTPUTS) + cache
        counts = {"encoder": (1, 3), "step": (len(graphs.STEP_INPUTS) - (not self.starts) + cache, 3 + cache),
                  "search": search, "search_small": search, "loop": (len(graphs.LOOP_INPUTS), len(graphs.LOOP_OUTPUTS))}
        for name, call in calls.items():
            given = getattr(call, "inputs", None), getattr(call, "outputs", None)  # None: torch's loader runs it
            if None not in given and given != counts[name]:
                raise UserError(f"{directory / name}.pt2: the compiled model takes {given[0]} inputs and gives "
                                f"{given[1]} outputs, and this relmt's {name} graph takes {counts[name][0]} and gives "
                                f"{counts[name][1]}: an export of other graphs than this relmt's (relmt/export/"
                                f"graphs.py: GRAPHS_VERSION {graphs.GRAPHS_VERSION}); {AGAIN}")
        self.encoder, self.step = calls["encoder"], calls["step"]
        if "search" in calls:
            self.run_search = calls["search"] if "search_small" not in calls else \
                by_rows(calls["search_small"], calls["search"])
        if "loop" in calls:  # one sentence's whole search in one call (`loop_rows`)
            self.run_loop = calls["loop"]

    @property
    def loop_rows(self) -> int:
        """The most hypotheses whose whole search runs in one call of loop.pt2 (beam_search: `whole_search`): one
        sentence (SMALL_ROWS) on one thread; none on more, or without loop.pt2. More rows run step by step (their
        done sentences leave the batch). On one thread the loop decoded one sentence of 20 steps at 1.02x a call per
        step (docs/results/engines/search_loop_rel_1t.md), on two at 0.92x (search_loop_rel.md): so a process on one
        thread (a worker among several, a busy machine) gets it, and one on more keeps a call per step."""
        return SMALL_ROWS if self.run_loop is not None and torch.get_num_threads() == 1 else 0

    def run_encoder(self, src: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.encoder(src)

    def run_step(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        return self.step(*inputs)


def by_rows(small, large):
    """A search graph call that runs `small` for steps of at most SMALL_ROWS hypotheses (history: its first
    input, (B, K, T + 1)), else `large`: the same graph compiled two ways, so either gives the same search."""
    return lambda *inputs: (small if inputs[0].shape[0] * inputs[0].shape[1] <= SMALL_ROWS else large)(*inputs)


def flat_call(path: Path):
    """The package at `path` as a function of contiguous tensors to a tuple of tensors. relmt's graphs take and
    return flat tensors, so it calls the compiled model through its C ABI where it can (`released_call`, which lets
    other Python threads run meanwhile), else the package's loader directly (`boxed_run`): the package's own
    __call__ parses its input and output specs and (un)flattens them at every call, a cost of the same order as the
    search's other Python work per step at one sentence."""
    released = released_call(path)
    if released is not None:
        return released
    package = torch._inductor.aoti_load_package(str(path))
    loader = getattr(package, "loader", None)
    if loader is None or not hasattr(loader, "boxed_run"):  # another torch's package API
        return lambda *inputs: tuple(package(*(x.contiguous() for x in inputs)))
    return lambda *inputs: tuple(loader.boxed_run([x.contiguous() for x in inputs]))


def released_call(path: Path):
    """The package's compiled model called through the C ABI of its shared library (AOTInductorModelContainerRun)
    with ctypes, which releases Python's GIL for the call, as torch's own operators do; None where the package is not
    one this can call so (another torch's layout, weights kept beside the library, kernels run by a proxy executor).

    torch's binding of AOTInductor packages (`AOTIModelPackageLoader.boxed_run`) holds the GIL while the compiled
    model runs: in relmt-serve, the HTTP side (uvicorn's event loop, which parses requests and writes answers) then
    waits for every decoding step to end (issue 70). This does what that binding does, the GIL aside: it makes one
    model container from the package's library and runs it on handles to the input tensors, which the run takes
    over, and wraps the output handles it returns (torch._C._aoti's helpers, which the binding's C++ uses too)."""
    import ctypes
    import shutil
    import tempfile
    import zipfile

    aoti = torch._C._aoti
    if not all(hasattr(aoti, f) for f in ("unsafe_alloc_void_ptrs_from_tensors",
                                          "alloc_tensors_by_stealing_from_void_ptrs")):
        return None
    if not zipfile.is_zipfile(path):  # not a package this can read: torch's loader says what is wrong with it
        return None
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        libraries = [n for n in names if n.endswith(".so")]
        # one library; no proxy executor's kernels (<library>.json) and no weights stored apart from it
        if len(libraries) != 1 or libraries[0][:-3] + ".json" in names or \
                any("/constants/" in n or "/weights/" in n for n in names):
            return None
        folder = Path(tempfile.mkdtemp(prefix="relmt-aoti-"))
        try:
            library = ctypes.CDLL(z.extract(libraries[0], folder))
        except OSError:  # a library this process cannot load: torch's loader then tries, and says why
            return None
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the library stays loaded
    handle, inputs, outputs = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
    if library.AOTInductorModelContainerCreateWithDevice(ctypes.byref(handle), ctypes.c_size_t(1), b"cpu", None) or \
            library.AOTInductorModelContainerGetNumInputs(handle, ctypes.byref(inputs)) or \
            library.AOTInductorModelContainerGetNumOutputs(handle, ctypes.byref(outputs)):
        return None
    run = library.AOTInductorModelContainerRun
    run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    run.restype = ctypes.c_int32
    n_in, n_out = inputs.value, outputs.value
    In, Out = ctypes.c_void_p * n_in, ctypes.c_void_p * n_out  # the handles' arrays, their types made once
    try:  # why a run failed, which the library keeps (for the thread that ran it) and writes to stderr
        last_error = library.AOTInductorGetLastError
        last_error.argtypes, last_error.restype = [ctypes.POINTER(ctypes.c_char_p)], ctypes.c_int32
    except AttributeError:  # a library without it (another torch's)
        last_error = None

    def reason() -> str:
        message = ctypes.c_char_p()
        if last_error is None or last_error(ctypes.byref(message)) or not message.value:
            return "the reason is on the process's standard error"
        return message.value.decode(errors="replace").strip()
    # torch's helpers pass the handles as capsules of the pointers
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype, capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    def call(*inputs: Tensor) -> tuple[Tensor, ...]:
        # the container checks the counts outside its own error handling: another count would abort the process
        if len(inputs) != n_in:
            raise RuntimeError(f"{path}: the compiled model takes {n_in} inputs, and was given {len(inputs)} (a "
                               f"package of other graphs than this relmt's? {AGAIN})")
        handles = In(*[pointer(h, None) for h in aoti.unsafe_alloc_void_ptrs_from_tensors(
            [x.contiguous() for x in inputs])])
        out = Out()
        if run(handle, handles, n_in, out, n_out, None, None):
            raise RuntimeError(f"{path}: the compiled model failed (AOTInductorModelContainerRun): {reason()}")
        return tuple(aoti.alloc_tensors_by_stealing_from_void_ptrs([capsule(p, None, None) for p in out]))

    call.inputs, call.outputs = n_in, n_out  # what AotiModel checks an export's packages by
    return call  # the container and its library stay for the process's life
