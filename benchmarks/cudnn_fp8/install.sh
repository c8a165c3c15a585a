# On the GPU machine, in the project root: `source benchmarks/cudnn_fp8/install.sh` installs the cuDNN frontend
# wheel carried in .cudnn/ into /tmp/cudnnfe and puts it on PYTHONPATH (skips the install when it is there).
# Needs nothing else: torch's cuDNN (nvidia-cudnn-cu13) is the library it drives. Sourced: no `exit`, no `set -e`.
if ! ls .cudnn/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  echo "cudnn_fp8: no wheel in .cudnn/ (run benchmarks/cudnn_fp8/prepare.sh here, then carry [\".cudnn\"])" >&2
else
  [ -d /tmp/cudnnfe/cudnn ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/cudnnfe .cudnn/nvidia_cudnn_frontend-*.whl
  export PYTHONPATH=/tmp/cudnnfe:${PYTHONPATH:-}
  python3 -c "import torch, cudnn; print('cudnn_fp8: frontend', cudnn.__version__, 'cuDNN', cudnn.backend_version(), 'torch', torch.__version__, torch.backends.cudnn.version())" \
    || echo "cudnn_fp8: the frontend does not import or finds no libcudnn (see the README's notes)" >&2
fi
