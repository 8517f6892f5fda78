// YOLOv10's detection stage around the top_k op (kernels/models/detections.py): the per-anchor best
// score, the gather of the chosen anchors' class scores, and the rows [x1, y1, x2, y2, score, class].
// decoded is (batch, channels, anchors), channels = 4 box coordinates + nc class scores. Each output
// element is written by one thread, from values it only copies or compares: no arithmetic to round,
// no atomics, the same bits as the NumPy code on every run. Grid-stride loops over the outputs.
#include "common.cuh"

// best[b, a] = the max over c of decoded[b, 4 + c, a]: the first of equal values, NaN where any is NaN
// (NumPy's max).
template <typename T>
__global__ void detections_best(const T* __restrict__ decoded, T* __restrict__ best, long long batch, int channels,
                                int anchors) {
    using C = compute_t<T>;
    const long long total = batch * anchors;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long b = t / anchors, a = t % anchors;
        const T* scores = decoded + (b * channels + 4) * anchors + a;
        T chosen = scores[0];
        C largest = widen(chosen);
        for (int c = 1; c < channels - 4; ++c) {
            const T value = scores[(long long)c * anchors];
            const C wide = widen(value);
            if (largest == largest && !(largest >= wide)) {  // not NaN yet, and the new value larger or NaN
                chosen = value;
                largest = wide;
            }
        }
        best[t] = chosen;
    }
}

// scores[b, j * nc + c] = decoded[b, 4 + c, anchor[b, j]]: the class scores of the k chosen anchors.
template <typename T>
__global__ void detections_gather(const T* __restrict__ decoded, const long long* __restrict__ anchor,
                                  T* __restrict__ scores, long long batch, int channels, int anchors, int k) {
    const int nc = channels - 4;
    const long long per_image = (long long)k * nc, total = batch * per_image;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long b = t / per_image, r = t % per_image;
        const long long j = r / nc, c = r % nc;
        scores[t] = decoded[(b * channels + 4 + c) * anchors + anchor[b * k + j]];
    }
}

// rows[b, j] = [decoded[b, 0:4, a], value[b, j], top[b, j] % nc] with a = anchor[b, top[b, j] / nc].
template <typename T>
__global__ void detections_rows(const T* __restrict__ decoded, const long long* __restrict__ anchor,
                                const T* __restrict__ value, const long long* __restrict__ top, T* __restrict__ rows,
                                long long batch, int channels, int anchors, int k) {
    using C = compute_t<T>;
    const int nc = channels - 4;
    const long long total = batch * k;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long b = t / k, chosen = top[t];
        const long long a = anchor[b * k + chosen / nc];
        T* row = rows + t * 6;
#pragma unroll
        for (int i = 0; i < 4; ++i) row[i] = decoded[(b * channels + i) * anchors + a];
        row[4] = value[t];
        row[5] = narrow<T>(static_cast<C>(chosen % nc));
    }
}
