#!/usr/bin/env bash
# Builds ms_atb's AscendC custom ops (ops/ascendc: MsAtbPagedAttention, MsAtbReshapeAndCache) with
# MindSpore's offline compiler for CANN custom ops, installs the package, and prints the environment
# to export so that attention_backend ms_atb finds it.
#   ASCEND_HOME_PATH=/usr/local/Ascend/ascend-toolkit/latest bash scripts/build_ascend_ops.sh [install dir]
# Needs an Ascend machine's CANN toolkit (ASCEND_HOME_PATH) and a MindSpore wheel that ships
# lib/plugin/ascend/custom_compiler. The install dir defaults to ./build/ascend_opp.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOC_VERSION="${SOC_VERSION:-ascend910b}"
VENDOR="ms_atb"
PYTHON="${PYTHON:-python}"

if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
  echo "error: ASCEND_HOME_PATH is not set: point it at the CANN toolkit, e.g." >&2
  echo "  ASCEND_HOME_PATH=/usr/local/Ascend/ascend-toolkit/latest bash scripts/build_ascend_ops.sh" >&2
  exit 2
fi
if [[ ! -d "$ASCEND_HOME_PATH" ]]; then
  echo "error: ASCEND_HOME_PATH=$ASCEND_HOME_PATH is not a directory" >&2
  exit 2
fi
if [[ ! -d "$ASCEND_HOME_PATH/tools/op_project_templates/ascendc" && \
      ! -d "$ASCEND_HOME_PATH/tools/msopgen/template/operator_demo_projects/ascendc_operator_sample" ]]; then
  echo "error: $ASCEND_HOME_PATH holds no AscendC custom-op project template (tools/op_project_templates/ascendc):" >&2
  echo "  it is not a CANN toolkit with the AscendC compiler" >&2
  exit 2
fi
COMPILER="$("$PYTHON" -c 'import os, mindspore; print(os.path.join(os.path.dirname(mindspore.__file__), "lib", "plugin", "ascend", "custom_compiler", "setup.py"))')"
if [[ ! -f "$COMPILER" ]]; then
  echo "error: MindSpore's custom-op compiler is missing ($COMPILER): install a MindSpore wheel for Ascend" >&2
  exit 2
fi

INSTALL_DIR="$(mkdir -p "${1:-$ROOT/build/ascend_opp}" && cd "${1:-$ROOT/build/ascend_opp}" && pwd)"
# setup.py writes build.log / install.log into the current directory and its project beside itself.
WORK="$(mktemp -d)"
cd "$WORK"
"$PYTHON" "$COMPILER" -o "$ROOT/ops/ascendc/op_host" -k "$ROOT/ops/ascendc/op_kernel" \
  --soc_version "$SOC_VERSION" --ascend_cann_package_path "$ASCEND_HOME_PATH" \
  --vendor_name "$VENDOR" --install_path "$INSTALL_DIR"
echo "built and installed into $INSTALL_DIR/vendors/$VENDOR (logs in $WORK)"
echo "export before running ms_atb with attention_backend ms_atb (the default on npu):"
echo "  export ASCEND_CUSTOM_OPP_PATH=$INSTALL_DIR/vendors/$VENDOR:\${ASCEND_CUSTOM_OPP_PATH:-}"
