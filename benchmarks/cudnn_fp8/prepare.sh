#!/usr/bin/env bash
# Run on your own machine, in the project root: downloads the cuDNN frontend's wheel (nvidia-cudnn-frontend,
# Python 3.12, manylinux x86_64, 11 MiB: its compiled extension is inside) into the ignored folder .cudnn/,
# for the GPU machine (which has no network). Carry it with `carry: [".cudnn"]` and source install.sh there.
set -euo pipefail
version=${CUDNN_FE_VERSION:-1.32.0}
mkdir -p .cudnn
grep -qx '/.cudnn/' "$(git rev-parse --git-common-dir)/info/exclude" || echo '/.cudnn/' >> "$(git rev-parse --git-common-dir)/info/exclude"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  -d .cudnn "nvidia-cudnn-frontend==$version"
wheel=$(ls .cudnn/nvidia_cudnn_frontend-"$version"-cp312-*.whl)
listing=$(unzip -l "$wheel")
case $listing in
  *cudnn/_compiled_module.cpython-312-x86_64-linux-gnu.so*) echo "cudnn_fp8: $wheel holds its compiled extension" ;;
  *) echo "cudnn_fp8: $wheel has no compiled extension" >&2; exit 1 ;;
esac
du -sh .cudnn
