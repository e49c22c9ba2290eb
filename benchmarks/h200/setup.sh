# Sourced at the start of every H200 run: wheels the image lacks (optuna, fla), repo on the path.
set -u
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || { echo "wheel install failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c "import torch, triton, optuna; print('torch', torch.__version__, 'triton', triton.__version__, 'optuna', optuna.__version__)"
sandbox() { python3 -m sandbox.cli "$@"; }
