"""The ``layout`` group (conf/layout/, core/config/layout.py): every option composes and validates in the world
it asks for and expresses its source; each impossible layout is refused by ``prepare``, before any model,
naming the keys, the values and what was expected; ``scale=tiny`` collapses every layout to the machine at hand;
the RL batch arithmetic divides over the layout's learners."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from core.config.layout import MODES, engines
from core.config.scale import apply_scale
from core.config.pipeline import prepare
from core.config.validate import ConfigError
from core.launch import placement
from core.paths import CONF_DIR

LAYOUTS = sorted(p.stem for p in (CONF_DIR / "layout").glob("*.yaml"))

# Each source's layout as the (later) recipe selects it: option, the rollout engine and TP the recipe sets (a
# dedicated layout's engines are vLLM servers, one host each), and what it must give:
# (learners, engines, learner nodes, ranks per learner node, the servers as node:devices:port).
SOURCES = {
    "single": ([], (1, 1, 1, 1, "")),
    "colocate": ([], (8, 8, 1, 8, "")),  # OpenRLHF hybrid engine 1x8 (its 4 x TP 2 engines: TP=2 below)
    "dedicated": (["rollout=vllm_server"], (7, 1, 1, 7, "0:7:8000")),  # Open-Instruct 8B RLVR; Open-R1 Math-7B 7+1
    "open_instruct_70b": (["rollout=vllm_server", "rollout.vllm.tensor_parallel_size=4"],
                          (40, 1, 5, 8, "5:0,1,2,3:8000")),
    # trl vllm-serve --dp 8 --tp 1 on node 2: 8 servers here
    "open_r1_2node": (["rollout=vllm_server", f"rollout.server.hosts=[{','.join(['n2'] * 8)}]"],
                      (8, 8, 1, 8, " ".join(f"1:{j}:{8000 + j}" for j in range(8)))),
    "simplerl_zoo_2node": (["rollout=vllm", "rollout.vllm.tensor_parallel_size=2"], (16, 8, 2, 8, "")),
    "simplerl_zoo_8node": (["rollout=vllm", "rollout.vllm.tensor_parallel_size=8"], (64, 8, 8, 8, "")),
}


def _batches(learners: int) -> list[str]:
    """RL batch sizes that divide over ``learners`` ranks (2 prompts x 8 completions per rank, one optimiser
    step per RL step, 16-completion micro-batches)."""
    return [f"train.prompts_per_step={2 * learners}", "train.group_size=8", f"train.mini_batch_size={16 * learners}",
            "train.micro_batch_size=16"]


def test_discovery_found_every_layout_and_mode():
    assert LAYOUTS == sorted(SOURCES) and len(LAYOUTS) == 7
    assert MODES.names() == ["colocate", "dedicated"]


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_validates_in_its_world_and_places_its_source(compose_cfg, monkeypatch, name):
    overrides, (learners, n_engines, learner_nodes, nproc, servers) = SOURCES[name]
    monkeypatch.setenv("WORLD_SIZE", str(learners))  # what torchrun (or the submitit export) gives each rank
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(learners))
    prepared = prepare(compose_cfg(f"layout={name}", *overrides, *_batches(learners)), packages=False)  # no vLLM here
    cfg, lay = prepared.config, prepared.plan.layout
    assert cfg.layout.learner_gpus == lay.learner_gpus == learners and engines(cfg) == lay.engines == n_engines
    where = placement(lay, OmegaConf.select(cfg, "rollout.server.port"))
    assert (where["LEARNER_NODES"], where["NPROC_PER_NODE"]) == (learner_nodes, nproc)
    assert where["SERVERS"] == servers


# overrides, the world the ranks run in, a fragment of the refusal: one case per check of layout_problems.
BAD = [
    (["layout=colocate", "layout.learner_gpus=16"], 16,
     "layout.learner_gpus=16 is more GPUs than layout.nodes x layout.gpus_per_node = 1 x 8 = 8"),
    (["layout=colocate", "rollout=vllm", "rollout.vllm.tensor_parallel_size=16"], 8,
     "rollout.vllm.tensor_parallel_size=16 is larger than layout.gpus_per_node=8: a tensor-parallel engine runs "
     "within one node"),
    (["layout=dedicated", "rollout=vllm_server", "layout.rollout_gpus=2"], 7,
     "layout.learner_gpus + layout.rollout_gpus = 7 + 2 = 9 GPUs do not fit in layout.nodes x layout.gpus_per_node "
     "= 1 x 8 = 8: the rollout GPUs would overlap the learners' without colocation"),
    (["layout=open_instruct_70b", "layout.rollout_gpus=3", "rollout=vllm_server",
      "rollout.vllm.tensor_parallel_size=2"], 40,
     "layout.rollout_gpus=3 is not a multiple of rollout.vllm.tensor_parallel_size=2: each vLLM engine takes 2 of "
     "the rollout GPUs"),
    (["layout=colocate", "layout.learner_gpus=6", "rollout=vllm", "rollout.vllm.tensor_parallel_size=4"], 6,
     "layout.learner_gpus=6 is not a multiple of rollout.vllm.tensor_parallel_size=4"),
    (["layout=colocate"], 1, "layout.learner_gpus=8 but this run has 1 rank(s) (no WORLD_SIZE: one process)"),
    (["layout=colocate"], 4, "layout.learner_gpus=8 but this run has 4 rank(s) (WORLD_SIZE=4)"),
    (["layout=colocate", "layout.rollout_gpus=1"], 8, "layout.rollout_gpus=1 with layout.mode=colocate"),
    (["layout=dedicated", "rollout=vllm_server", "layout.rollout_gpus=0"], 7,
     "layout.mode=dedicated with layout.rollout_gpus=0"),
    (["layout=simplerl_zoo_2node", "layout.learner_gpus=12"], 12,
     "layout.learner_gpus=12 spans nodes but is not a multiple of layout.gpus_per_node=8"),
    (["layout=dedicated", "rollout=vllm_server"], 7,
     "train.prompts_per_step x train.group_size = 16 x 8 = 128 completions is not divisible by the world size 7"),
    (["layout.mode=hybrid"], 1, "layout.mode='hybrid': expected one of ['colocate', 'dedicated']"),
    (["rollout=vllm_server", "rollout.server.port=0"], 1, "rollout.server.port=0: expected a number in [1, 65535]"),
    (["rollout=vllm_server", "rollout.server.timeout_s=0"], 1, "rollout.server.timeout_s=0.0: expected a number > 0"),
    (["layout=dedicated"], 7, "layout.mode=dedicated with rollout.engine=hf: GPUs that only generate are reached "
                              "through vLLM servers"),
    (["layout=colocate", "rollout=vllm_server"], 8, "layout.mode=colocate with rollout.engine=vllm_server"),
    (["layout=open_r1_2node", "rollout=vllm_server"], 8,
     "rollout.server.hosts has 1 host(s) but the layout has 8 vLLM engine(s) (layout.rollout_gpus=8 / "
     "rollout.vllm.tensor_parallel_size=1): give one host per engine"),
    (["layout=dedicated", "rollout=vllm_server", "rollout.vllm.enable_sleep_mode=true"], 7,
     "rollout.vllm.enable_sleep_mode=true with rollout.engine=vllm_server"),
]


@pytest.mark.parametrize("overrides, world, message", BAD)
def test_an_impossible_layout_is_refused_naming_keys_values_and_expectation(compose_cfg, monkeypatch, overrides,
                                                                              world, message):
    if world == 1:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(ConfigError) as e:
        prepare(compose_cfg(*overrides))
    assert message in str(e.value)


def test_the_cases_cover_every_check():
    assert len(BAD) == 18 and len({tuple(o) for o, _, _ in BAD}) == 17  # colocate's world checked twice


def test_the_batch_split_uses_the_layouts_learners_not_the_process(compose_cfg, monkeypatch):
    """``prepare`` divides the batches over ``layout.learner_gpus``, as each of those ranks will."""
    monkeypatch.setenv("WORLD_SIZE", "7")
    plan = prepare(compose_cfg("layout=dedicated", "rollout=vllm_server", *_batches(7)), packages=False).plan
    assert plan.samples_per_rank == 16
    # Open-R1 Math-7B on 7 learners: per-device 16 x 7 = 112 completions, num_generations 7; 16 rows per rank, so
    # groups span ranks, as TRL splits them
    prepare(compose_cfg("layout=dedicated", "rollout=vllm_server", "train.prompts_per_step=16",
                        "train.group_size=7", "train.mini_batch_size=112", "train.micro_batch_size=16"), packages=False)
    with pytest.raises(ConfigError, match=r"train.mini_batch_size=112 is not divisible by train.micro_batch_size x "
                                          r"world size = 32 x 7"):
        prepare(compose_cfg("layout=dedicated", "rollout=vllm_server", *_batches(7)[:3],
                            "train.micro_batch_size=32"), packages=False)


@pytest.mark.parametrize("name", LAYOUTS)
def test_tiny_scale_collapses_every_layout_to_the_machine(compose_cfg, monkeypatch, name):
    for world in (1, 2):
        cfg = apply_scale(compose_cfg(f"layout={name}", "scale=tiny"), world=world)
        lay = {k: cfg.layout[k] for k in ("mode", "nodes", "gpus_per_node", "learner_gpus", "rollout_gpus")}
        assert lay == {"mode": "colocate", "nodes": 1, "gpus_per_node": world, "learner_gpus": world,
                       "rollout_gpus": 0}, name
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    prepare(compose_cfg(f"layout={name}", "scale=tiny"))  # runs as one process


@pytest.mark.parametrize("name", LAYOUTS)
def test_tiny_scale_collapses_the_engines_of_every_source_layout(compose_cfg, monkeypatch, name):
    """The source's engine and TP go with its GPUs: scale=tiny generates with hf, one engine per rank."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = prepare(compose_cfg(f"layout={name}", *SOURCES[name][0], "scale=tiny")).config
    assert cfg.rollout.engine == "hf" and cfg.layout.learner_gpus == 1 and engines(cfg) == 1, name


def test_tiny_scale_keeps_a_layout_key_set_on_the_command_line(compose_cfg):
    cfg = apply_scale(compose_cfg("layout=colocate", "scale=tiny", "layout.learner_gpus=2"), ("layout.learner_gpus",),
                      world=2)
    assert cfg.layout.learner_gpus == 2 and cfg.layout.nodes == 1
