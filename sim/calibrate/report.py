"""The text report of ``clustersim calibrate``: which constants changed, from what to what, on
how many points, with what residual; per nccl-tests size measured vs calibrated; per run the
distance from the fit; per trace the kernel classes and traced vs simulated breakdown."""


def print_report(report: dict) -> None:
    """Print the report (the same content as ``--json``)."""
    print(f"calibration profile {report['profile']} (clustersim {report.get('clustersim_version', '?')}, "
          f"{report.get('topology')} / {report.get('gpu')})")
    _changes(report["changes"])
    for t in report["nccl_tests"]:
        _table(t)
    if report["runs"]:
        print("\nstep times (measured vs simulated)")
        print(f"  {'file':40} {'scenario':24} {'measured_s':>10} {'preset_s':>10} {'calibrated_s':>12} {'error':>7} "
              f"{'elast.':>6}  host")
        for r in report["runs"]:
            print(f"  {r['file'][-40:]:40} {r['scenario'][:24]:24} {r['measured_s']:>10.4f} {r['preset_s']:>10.4f} "
                  f"{r['calibrated_s']:>12.4f} {r['error']:>+7.1%} {_elasticity(r):>6}  {_host(r)}")
    for t in report["traces"]:
        _trace(t)
    if "unchanged_inputs" in report:
        same = sum(report["unchanged_inputs"])
        print(f"\ncheck: {same} of {len(report['unchanged_inputs'])} inputs still have the recorded SHA-256; "
              f"profile written by clustersim {report.get('clustersim_version')}, this is {report['version_now']}")


def _elasticity(run: dict) -> str:
    return f"{run['elasticity']:.2f}" if "elasticity" in run else "-"


def _host(run: dict) -> str:
    """Whether the simulated step is host-bound (its GPU's wait for the host) and whether the run
    entered the sustained fit."""
    verdict = f"host-bound, GPU waits {run['host_wait_s'] * 1e3:.2f} ms" if run["host_bound"] else "-"
    return verdict + ("" if run.get("in_fit", True) else "; not in the fit (the step does not move with the factor)")


def _changes(changes: list[dict]) -> None:
    print(f"\n{'constant':30} {'preset':>10} {'fitted':>10} {'points':>6} {'resid before':>12} {'resid after':>11}  from")
    for c in changes:
        after = "-" if c.get("after") is None else f"{c['after']:.4g}"
        before = "-" if c.get("before") is None else f"{c['before']:.4g}"
        rb = f"{c['residual_before']:.2%}" if c.get("residual_before") is not None else "-"
        ra = f"{c['residual_after']:.2%}" if c.get("residual_after") is not None else "-"
        print(f"{c['constant']:30} {before:>10} {after:>10} {c['points']:>6} {rb:>12} {ra:>11}  {c['source']}"
              + (f" ({c['note']})" if c.get("note") else ""))


def _table(t: dict) -> None:
    print(f"\n{t['file']}: {t['op']} on {t['gpus']} GPUs (algo {t['algo']}{'' if t['nvls'] else ', NVLS off'}); "
          f"largest |error| {t['max_abs_error']:.1%}")
    print(f"  {'bytes':>12} {'measured_us':>12} {'preset_us':>12} {'calibrated_us':>13} {'error':>7}")
    for r in t["rows"]:
        print(f"  {r['bytes']:>12} {r['measured_us']:>12.2f} {r['preset_us']:>12.2f} {r['calibrated_us']:>13.2f} "
              f"{r['error']:>+7.1%}")


def _trace(t: dict) -> None:
    print(f"\n{t['file']}: rank {t['rank']}, {t['steps']} profiler step(s); GPU kernel time per step by class")
    if t.get("launched_before"):
        print(f"  ({t['launched_before']} kernels launched before the trace began, a warm-up step's queued work, "
              "left out)")
    for c in t["classes"]:
        print(f"  {c['class']:32} {c['kernels']:>6} kernels {c['time_s'] * 1e3:>10.3f} ms {c['share']:>7.1%}")
    if t.get("gemm_shapes"):
        print(f"  GEMM shapes by time: {'min dim':>8} {'GFLOP':>9} {'launches':>8} {'ms/step':>9} {'traced':>7} "
              f"{'preset':>7} {'calibr.':>7}  (share of the dense BF16 peak)")
        for g in t["gemm_shapes"]:
            sim = (f"{g['preset_eff']:>7.1%} {g['calibrated_eff']:>7.1%}" if g["half"] else
                   f"{'-':>7} {'-':>7}  (not BF16/FP16)")
            print(f"  {'':20} {g['min_dim']:>8.0f} {g['gflop']:>9.3f} {g['launches']:>8} {g['time_s'] * 1e3:>9.3f} "
                  f"{g['traced_eff']:>7.1%} {sim}")
    keys = ("compute_s", "exposed_comm_s", "idle_s", "host_wait_s", "step_s")
    sim = t.get("simulated")
    print(f"  {'per step (ms)':32} {'traced':>10}" + (f" {'simulated':>10}" if sim else ""))
    for k in keys:
        label = "  of it waiting for the host" if k == "host_wait_s" else k.removesuffix("_s")
        print(f"  {label:32} {t['traced'][k] * 1e3:>10.3f}" + (f" {sim[k] * 1e3:>10.3f}" if sim else ""))
