"""Renders and lints charts/switchyard with the real Helm library (helm-python-sdk, Helm v4).

Usage: render.py CHART VALUES.json  -> prints JSON:
  {"manifests": {template: text}, "lint": {...}} or {"error": message} when Helm refuses
  the values. Exit 3 when helm_python is not installed (the caller decides if that skips).
"""
import json
import sys

try:
    import helm_python as helm
except ImportError as e:  # pragma: no cover - reported to the Rust test
    print(f"helm_python not importable: {e}", file=sys.stderr)
    sys.exit(3)


def main() -> None:
    chart_dir, values_path = sys.argv[1], sys.argv[2]
    with open(values_path, encoding="utf-8") as f:
        values = json.load(f)
    chart = helm.Chart.load(chart_dir)
    try:
        manifests = chart.render(values, name="sy", namespace="kube-system", is_install=True)
    except helm.HelmError as e:
        print(json.dumps({"error": str(e)}))
        return
    report = helm.lint(chart_dir, values, strict=True, namespace="kube-system")
    print(json.dumps({"manifests": manifests, "lint": report}))


if __name__ == "__main__":
    main()
