"""Clusters: presets, placements, TOML files, and one-line CLI errors for bad real-units input."""

from __future__ import annotations

import itertools
import json

import pytest

from analysis.cli.simulate import main
from schedules import ClusterError
from sim.costs.cluster import DEVICE_PRESETS, Cluster, Device, cluster_preset, load_cluster, parse_placement
from sim.costs.parallel import ParallelConfig


def test_presets_load_with_vendor_figures():
    c = cluster_preset("dgx-h100:2")
    assert (c.num_devices, c.num_nodes, c.spec.name) == (16, 2, "H100")
    assert (c.spec.peak_flops, c.spec.memory_bytes) == (989e12, 81559 * 2**20)  # the driver's MiB, sim/costs/cluster.py
    assert (c.intra.bandwidth, c.inter.bandwidth) == (450e9, 50e9)
    a = cluster_preset("dgx-a100:4+ps2")
    assert (a.num_devices, len(a.pservers), a.spec.peak_flops, a.intra.bandwidth) == (32, 2, 312e12, 300e9)
    assert cluster_preset("dgx-h200").spec.memory_bytes == 141e9


@pytest.mark.parametrize(("text", "devices"), [
    ("/trainer/GPU:0-2", [Device(0, "trainer", "GPU", i) for i in range(3)]),
    ("node1/trainer/GPU:0-3", [Device(1, "trainer", "GPU", i) for i in range(4)]),
    ("/pserver/CPU:0", [Device(0, "pserver", "CPU", 0)]),
])
def test_placements_parse(text, devices):
    assert parse_placement(text) == devices


@pytest.mark.parametrize("text", ["trainer/GPU:0", "/trainer/GPU", "/worker/GPU:0", "/trainer/GPU:3-1", "node/trainer/GPU:0"])
def test_malformed_placement_is_one_line_error(text):
    with pytest.raises(ClusterError, match="malformed placement") as err:
        parse_placement(text)
    assert "\n" not in str(err.value)


def test_toml_cluster_loads(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[cluster]\nname = "lab"\ndevice = "A100"\nintra_GBps = 300\ninter_GBps = 12.5\n'
        'devices = ["node0/trainer/GPU:0-3", "node1/trainer/GPU:0-3", "node2/pserver/CPU:0"]\n'
    )
    c = load_cluster(path)
    assert (c.name, c.num_devices, c.num_nodes, len(c.pservers)) == ("lab", 8, 2, 1)
    assert (c.spec.name, c.intra.bandwidth, c.inter.bandwidth) == ("A100", 300e9, 12.5e9)
    assert c.link_between(0, 3) is c.intra and c.link_between(0, 4) is c.inter


def test_toml_study_runs_from_cli(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(
        '[model]\npreset = "gpt-tiny"\n[cluster]\ndevices = ["/trainer/GPU:0-3"]\n'
        '[parallel]\npp = 2\ndp = 2\ndp_mode = "ddp"\n[run]\nschedule = "1f1b"\nmicrobatches = 4\n'
    )
    assert main(["--config", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["pp"], d["costs"]["dp"], d["costs"]["dp_mode"], len(d["devices"])) == (2, 2, "ddp", 2)
    assert d["step_time"] > 0 and 0 < d["mfu"] < 1


_BASE = ["--model", "gpt-6.2b", "--cluster", "dgx-h100:2", "--pp", "8", "--schedule", "1f1b", "--microbatches", "8"]


@pytest.mark.parametrize(("change", "message"), [
    (["--model", "gpt-99b"], "unknown model 'gpt-99b'"),
    (["--cluster", "dgx-x"], "unknown cluster 'dgx-x'"),
    (["--dp-mode", "zero9"], "unknown dp mode 'zero9'"),
    (["--dp", "4"], "pp*dp*tp = 8*4*1 = 32 devices do not fit cluster 'dgx-h100:2'"),
    (["--dp", "2", "--dp-mode", "ps"], "dp mode 'ps' needs parameter servers"),
    (["--config", "/nonexistent/x.toml"], "config file '/nonexistent/x.toml' not found"),
    (["--pp", "40", "--cluster", "dgx-h100:5"], "40 stages but the model has 30 layers"),  # 32: embedding, head alone
    (["--efficiency", "2"], "efficiency must be a fraction of peak in (0, 1], got 2.0 (flag --efficiency)"),
])
def test_bad_real_input_is_one_line_exit_2(change, message, capsys):
    argv = list(_BASE)
    for flag, value in zip(change[::2], change[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert message in err and err.count("\n") == 1


def test_cpu_host_preset():
    """This kind of host: two cores of 64 GFLOP/s (fp32, assumed) and 12 GB each, loopback links."""
    c = cluster_preset("cpu-host")
    assert [d.type for d in c.devices] == ["CPU", "CPU"]
    assert (c.spec.peak_flops, c.spec.memory_bytes) == (64e9, 12e9)
    assert (c.intra.bandwidth, c.inter.bandwidth) == (2e9, 1.25e9)
    assert len(cluster_preset("cpu-host:3").devices) == 6


def test_llama_presets_parameter_counts():
    """Llama 3 8B and 70B (GQA, SwiGLU, untied head): 8.03B and 70.55B parameters, counted by hand.

    8B: per layer 2h^2 + 2h*1024 + 3h*14336 + 2h = 218,112,000 with h=4096; x32 plus two 128256 x 4096
    tables and the final norm: 8,030,261,248. F FLOPs per token and layer = 2 x the matrices + 4sh.
    """
    from sim.costs.transformer import model_preset

    m = model_preset("llama-8b")
    h = 4096
    layer = 2 * h * h + 2 * h * 1024 + 3 * h * 14336 + 2 * h
    assert m.layer_params == layer == 218_112_000
    assert m.params == 32 * layer + 2 * 128256 * h + h == 8_030_261_248
    assert m.layer_flops("F") == 2 * (layer - 2 * h) + 4 * 8192 * h
    assert model_preset("llama-70b").params == 70_553_706_496


def test_real_units_plot_and_exports(tmp_path, capsys):
    """--plot and --export-csv work in real units too (the pipeline part of the schedule)."""
    png, csv = tmp_path / "t.png", tmp_path / "s.csv"
    assert main([*_BASE, "--plot", str(png), "--export-csv", str(csv)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    rows = csv.read_text().splitlines()
    assert len(rows) == 8 and rows[0].startswith("0F0,0F1,")
    assert f"wrote timeline: {png}" in capsys.readouterr().out


def test_llama_on_cpu_host_overflows(capsys):
    """llama-70b cannot fit two 12 GB cores: the result flags the devices and says by how much."""
    assert main(["--model", "llama-70b", "--cluster", "cpu-host", "--pp", "2", "--schedule", "1f1b",
                 "--microbatches", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert all(dev["overflow"] for dev in d["devices"])
    assert d["devices"][0]["device"] == "node0/trainer/CPU:0"


def test_preset_links_run_at_nccls_achieved_fraction_of_the_line_rate():
    # the NCCL developers' bus bandwidths (sources in sim/costs/cluster.py): NVLink 4 370 of 450 GB/s, NVLink 3 160 of
    # 200 (A800), NDR 47 of 50, HDR 24 of 25
    h, a = cluster_preset("dgx-h100:2"), cluster_preset("dgx-a100:2")
    assert (h.intra.rate, h.inter.rate, a.intra.rate, a.inter.rate) == (
        450e9 * (370 / 450), 50e9 * (47 / 50), 300e9 * (160 / 200), 25e9 * (24 / 25))
    assert h.intra.time(370e6) == 3e-6 + 370e6 / (450e9 * (370 / 450))
    assert (h.describe()["intra_efficiency"], h.describe()["inter_efficiency"]) == (370 / 450, 47 / 50)


@pytest.mark.parametrize("value", [0.0, 1.5, -0.1])
def test_a_link_efficiency_outside_0_1_is_refused(value):
    from sim.costs.cluster import Link

    with pytest.raises(ClusterError) as exc:
        Link(alpha=1e-6, bandwidth=1e9, efficiency=value)
    assert str(exc.value) == f"link efficiency must be a fraction of the line rate in (0, 1], got {value!r}"


def _uneven_cluster() -> Cluster:
    devices = [Device(n, "trainer", "GPU", i) for n, k in ((0, 8), (3, 4), (5, 8), (6, 4)) for i in range(k)]
    return Cluster(name="uneven", spec=DEVICE_PRESETS["H100"], intra=cluster_preset("dgx-h100").intra,
                   inter=cluster_preset("dgx-h100").inter, devices=tuple(devices))


def test_nodes_are_counted_once_per_cluster():
    big, uneven = cluster_preset("dgx-h100:3"), _uneven_cluster()
    assert (big.node_size, big.node_sizes, big.num_nodes) == (8, (8,), 3)
    assert (uneven.node_size, uneven.node_sizes, uneven.num_nodes) == (0, (4, 8), 4)


@pytest.mark.parametrize("preset", ["dgx-h100:12", "cpu-host:24", "uneven"])
def test_dp_group_arithmetic_is_the_listed_group(preset):
    # The dp group's spread over nodes is arithmetic under dp-inner on even nodes; it must be what listing its
    # devices gives, for every rank, order and layout that fits (tp dividing a node).
    cluster = _uneven_cluster() if preset == "uneven" else cluster_preset(preset)
    world, checked = cluster.num_devices, 0
    for tp, cp, pp, order in itertools.product((1, 2, 4), (1, 2, 3), (1, 2, 3, 4, 6), ("dp-inner", "pp-inner")):
        if tp > min(cluster.node_sizes) or world % (tp * cp * pp):
            continue
        for dp in {1, 2, 3, world // (tp * cp * pp)}:
            if tp * cp * pp * dp > world:
                continue
            p = ParallelConfig(pp=pp, dp=dp, tp=tp, cp=cp, order=order)
            for r in range(pp):
                assert p.group(cluster, r) == p._group_listed(cluster, r), (tp, cp, pp, dp, order, r)
                checked += 1
    assert checked > 50
