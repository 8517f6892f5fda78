// top_k along the last dim of a (rows, n) tensor: the k largest values of each row in descending
// order and their int64 indices, in torch.sort(descending=True, stable=True)'s order: NaN above every
// number, -0.0 equal to +0.0, ties (NaN with NaN too) by the lower index first.
//
// top_k_forward<T, SHARED>: one block per row (grid-stride over rows). Each value maps to an unsigned
// key that orders as the values do (order_key). Where the plan gives the launch dynamic shared memory for
// a row's keys (cache_keys: n keys, plan.TOP_K_CACHE_BYTES at most), the row is read from global memory
// once, every thread's loads of it in flight together, and the passes below read the keys from shared
// memory; else each pass reads the row again (the loads of one pass a block's width at a time). Then:
//   1. radix select: the k-th largest key, 8 bits a pass from the top (2 passes for the half types'
//      16-bit keys, 4 for float, 8 for double), each pass a 256-bin histogram in shared memory of the
//      keys that match the digits chosen so far, the lanes of a warp with one digit adding their count
//      once (__match_any_sync); warp 0 then finds the bin holding the k-th key (choose_digit). The
//      histogram's counts are integers: the order in which the warps add them (shared-memory atomics)
//      cannot change them.
//   2. compaction in index order, each warp a contiguous chunk of the row (its counts, then the counts
//      of the warps before it, then its writes; two block barriers in all): every key above the
//      threshold, and the first (k - count above) keys equal to it, to k candidate slots (shared
//      memory when SHARED, else the state's global scratch, 2k a block: the slots and the sort's other buffer).
//   3. each candidate written at its rank, its place in (key descending, index ascending). The keys
//      equal to the threshold are the last ones, already in index order: their slot is their rank. The
//      others, above the threshold, also in index order: with the candidates in shared memory (k <= 1024)
//      each counts the ones with a larger (key, -index) (O(count^2) a row: a few us for k = 300); in the
//      scratch (larger k) they are sorted by a stable radix sort of their keys, 4 bits a pass from the
//      lowest, each warp a contiguous chunk placed by the digit counts of the warps before it (stable_sort;
//      O(count) a pass), so that k = n = 8400 no longer takes the O(k^2) count. The sort runs in the
//      launch's dynamic shared memory where the plan gives it 2k keys and 2k indices there (sort_shared:
//      k up to 13504 for 4-byte keys on an H200), else in the scratch.
// Nothing depends on the order threads run in, so every run gives the same bits.
//
// top_k_backward<T>: input_grad[r, i] = the sum, in order of j, of values_grad[r, j] over the j with
// indices[r, j] == i (0 where none), in compute_t<T>, rounded once: a gather (no atomics), one block a
// chunk of a row's elements (a thread an element, reading all k (index, gradient) pairs of the row, a tile
// at a time), so that a row's chunks run on many SMs at once; an index outside [0, n) is skipped. That is
// O(n k) a row: for a large k whose pairs fit in the launch's dynamic shared memory (2k keys and 2k ints),
// top_k_backward_sorted<T> computes the same sums in O(n + k) a row: a block a row zeroes the row, sorts
// its (index, j) pairs by index with stable_sort (so each index's j stay in order), and the first thread
// of each run of one index sums the run's gradients in that order and writes them.
#include "common.cuh"

#ifndef TOP_K_BLOCK
#error "TOP_K_BLOCK is defined by kernels/top_k/plan.py (CudaModule's -D options)"
#endif
#ifndef TOP_K_SHARED_CANDIDATES
#error "TOP_K_SHARED_CANDIDATES is defined by kernels/top_k/plan.py (CudaModule's -D options)"
#endif

#define FULL_MASK 0xffffffffu

// The key of each storage type: its bits as an unsigned integer of its width (the half types' 16-bit
// keys held in 32 bits), and how many bits the radix select walks.
template <class T> struct KeyOf { using type = unsigned int; static constexpr int BITS = 32; };
template <> struct KeyOf<double> { using type = unsigned long long; static constexpr int BITS = 64; };
template <> struct KeyOf<half_t> { using type = unsigned int; static constexpr int BITS = 16; };
template <> struct KeyOf<bfloat16_t> { using type = unsigned int; static constexpr int BITS = 16; };

// Sign-magnitude bits to an unsigned order: negatives complemented, positives with the sign bit set;
// -0.0 as +0.0 first, and every NaN (magnitude above infinity's) the largest key.
template <class K>
__device__ __forceinline__ K ordered(K bits, K sign, K inf, K largest) {
    if ((bits & ~sign) > inf) return largest;
    if (bits == sign) bits = 0;
    return (bits & sign) ? (~bits & largest) : (bits | sign);
}

__device__ __forceinline__ unsigned int order_key(float x) {
    return ordered<unsigned int>(__float_as_uint(x), 0x80000000u, 0x7f800000u, 0xffffffffu);
}
__device__ __forceinline__ unsigned long long order_key(double x) {
    return ordered<unsigned long long>(static_cast<unsigned long long>(__double_as_longlong(x)),
                                       0x8000000000000000ull, 0x7ff0000000000000ull, 0xffffffffffffffffull);
}
__device__ __forceinline__ unsigned int order_key(half_t x) {
    return ordered<unsigned int>(x.bits, 0x8000u, 0x7c00u, 0xffffu);
}
__device__ __forceinline__ unsigned int order_key(bfloat16_t x) {
    return ordered<unsigned int>(x.bits, 0x8000u, 0x7f80u, 0xffffu);
}

// After a radix pass: the digit of the k-th largest key, by the 32 lanes of warp 0 (every one calling).
// Lane l sums bins 255 - 8l down to 248 - 8l, a scan over the lanes finds the lane whose bins reach
// `need` keys counted from the top, and that lane walks its 8 bins; it writes the digits chosen so far
// and how many keys with them are still to be taken. Past every bin (never, while the histogram holds
// at least `need` keys) the digit is 0, as a walk down all 256 bins would give.
template <class K>
__device__ __forceinline__ void choose_digit(const unsigned int* histogram, int need, K prefix, int shift,
                                             K& chosen_prefix, int& chosen_need) {
    const int lane = threadIdx.x % 32, top = 255 - 8 * lane;
    int counts[8], sum = 0;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        counts[b] = static_cast<int>(histogram[top - b]);
        sum += counts[b];
    }
    int through = sum;  // the keys in this lane's bins and every bin above them
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        const int up = __shfl_up_sync(FULL_MASK, through, offset);
        if (lane >= offset) through += up;
    }
    const unsigned reach = __ballot_sync(FULL_MASK, through >= need);
    if (lane == (reach ? __ffs(reach) - 1 : 31)) {
        int above = through - sum, b = 0;
        for (; b < 7; ++b) {
            if (above + counts[b] >= need) break;
            above += counts[b];
        }
        chosen_prefix = prefix | (static_cast<K>(top - b) << shift);
        chosen_need = need - above;
    }
}

// Warp `warp` of `warps`'s contiguous chunk [begin, end) of m items: the chunks a multiple of 32 long,
// in order, so that a warp walking its chunk 32 items at a time keeps the items' order.
__device__ __forceinline__ void warp_chunk(int m, int warp, int warps, int& begin, int& end) {
    const long long chunk = ((static_cast<long long>(m) + warps - 1) / warps + 31) / 32 * 32;
    begin = static_cast<int>(min(static_cast<long long>(m), warp * chunk));
    end = static_cast<int>(min(static_cast<long long>(m), begin + chunk));
}

// A warp's digits by ballots, one a bit (a warp-level multisplit, in place of __match_any_sync:
// docs/performance.md#top_k-and-the-detections): made by every lane of the warp, each with its `digit` (its
// low BITS bits count) and `lanes`, the mask of the lanes taking part (the same in every lane); of(d) is then,
// in any lane, the mask of the lanes taking part whose digit is d.
template <int BITS>
struct DigitBallots {
    unsigned bits[BITS];
    unsigned lanes;

    __device__ __forceinline__ DigitBallots(unsigned digit, unsigned taking_part) : lanes(taking_part) {
#pragma unroll
        for (int bit = 0; bit < BITS; ++bit) bits[bit] = __ballot_sync(FULL_MASK, (digit >> bit) & 1u);
    }

    __device__ __forceinline__ unsigned of(unsigned d) const {
        unsigned mask = lanes;
#pragma unroll
        for (int bit = 0; bit < BITS; ++bit) mask &= ((d >> bit) & 1u) ? bits[bit] : ~bits[bit];
        return mask;
    }
};

// Sort keys[0, m) and index[0, m) (every thread of the block calling, m the same in each) by key,
// descending, keeping the order of equal keys: a least-significant-digit radix sort, 4 bits a pass (BITS / 4
// passes), between (keys, index) and (other_keys, other_index), in shared or global memory; returns the
// index buffer that holds the result (its keys beside it). Each pass: warp w takes the w-th contiguous
// chunk (warp_chunk) and counts its keys per digit (lane d < 16 adding up, in a register, digit d's lanes of
// each 32 keys: DigitBallots); the counts become each (digit, warp)'s first slot, the digits from 15 down and
// the warps in order within one (a warp scans one digit's counts over the warps, then each warp adds the
// totals of the digits above its own); then each warp walks its chunk again in order, writing each key to
// its digit's next slot (held by lane d < 16 for digit d, in a register) plus the lanes of its digit before
// it. A pass whose digit is the same in every key would move nothing: it is skipped (detector scores share
// their top bits). offsets holds 16 counts per warp, then the 16 digits' totals.
template <class K, int BITS>
__device__ int* stable_sort(K* keys, int* index, K* other_keys, int* other_index, int m, int* offsets) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    int begin, end;
    warp_chunk(m, warp, warps, begin, end);
    const unsigned below = (1u << lane) - 1u;
    int* mine = offsets + 16 * warp;
    int* totals = offsets + 16 * 32;
#pragma unroll 1
    for (int shift = 0; shift < BITS; shift += 4) {
        int keys_of_digit = 0;  // lane d < 16: the warp's keys of digit d
        for (int start = begin; start < end; start += 32) {
            const int i = start + lane;
            const unsigned digit = i < end ? static_cast<unsigned>((keys[i] >> shift) & 15) : 0u;
            const DigitBallots<4> ballots(digit, __ballot_sync(FULL_MASK, i < end));
            keys_of_digit += __popc(ballots.of(lane));
        }
        if (lane < 16) mine[lane] = keys_of_digit;
        __syncthreads();
        // Warp d (and d + warps, ...): digit d's counts over the warps (lane w: warp w's), scanned into each
        // warp's first slot among digit d's keys, and digit d's total.
        for (int digit = warp; digit < 16; digit += warps) {
            const int count = lane < warps ? offsets[16 * lane + digit] : 0;
            int through = count;
#pragma unroll
            for (int offset = 1; offset < 32; offset <<= 1) {
                const int up = __shfl_up_sync(FULL_MASK, through, offset);
                if (lane >= offset) through += up;
            }
            if (lane < warps) offsets[16 * lane + digit] = through - count;
            if (lane == 31) totals[digit] = through;
        }
        __syncthreads();
        // Each warp: its first slot of each digit after every key of the digits above it (15's first); lane
        // d < 16 keeps digit d's next slot.
        int next = 0;
        if (lane < 16) {
            int base = 0;
            for (int digit = 15; digit > lane; --digit) base += totals[digit];
            next = mine[lane] + base;
        }
        // Every thread reads the same totals: block-uniform. The next pass's totals are written after a barrier.
        if (__any_sync(FULL_MASK, lane < 16 && totals[lane] == m)) continue;
        for (int start = begin; start < end; start += 32) {
            const int i = start + lane;
            K key = 0;
            int at = 0;
            unsigned digit = 0u;
            if (i < end) {
                key = keys[i];
                at = index[i];
                digit = static_cast<unsigned>((key >> shift) & 15);
            }
            const DigitBallots<4> ballots(digit, __ballot_sync(FULL_MASK, i < end));
            const int first = __shfl_sync(FULL_MASK, next, static_cast<int>(digit));
            if (i < end) {
                const int slot = first + __popc(ballots.of(digit) & below);
                other_keys[slot] = key;
                other_index[slot] = at;
            }
            next += __popc(ballots.of(lane));
        }
        __syncthreads();  // the pass's writes before the next pass reads them; offsets reused
        K* swap_keys = keys; keys = other_keys; other_keys = swap_keys;
        int* swap_index = index; index = other_index; other_index = swap_index;
    }
    return index;
}

template <typename T, bool SHARED>
__global__ void __launch_bounds__(TOP_K_BLOCK) top_k_forward(
        const T* __restrict__ input, T* __restrict__ values, long long* __restrict__ indices,
        typename KeyOf<T>::type* __restrict__ scratch_keys, int* __restrict__ scratch_index,
        long long rows, int n, int k, int cache_keys, int sort_shared) {
    using K = typename KeyOf<T>::type;
    constexpr int BITS = KeyOf<T>::BITS;
    constexpr int SLOTS = SHARED ? TOP_K_SHARED_CANDIDATES : 1;
    // The launch's dynamic shared memory, one name for every instantiation (an extern __shared__ array of a
    // template type would be declared once per type): the row's keys where cache_keys (n of them, read by
    // steps 1-2), then, where sort_shared, the sort's two buffers (2k keys, then 2k indices) in step 3.
    extern __shared__ __align__(16) unsigned char top_k_dynamic[];
    K* row_keys = reinterpret_cast<K*>(top_k_dynamic);
    __shared__ unsigned int histogram[256];
    __shared__ int warp_counts[64];
    __shared__ K chosen_prefix;
    __shared__ int chosen_need;
    __shared__ K shared_keys[SLOTS];
    __shared__ int shared_index[SLOTS];
    __shared__ int sort_offsets[SHARED ? 1 : 16 * 32 + 16];  // stable_sort's: 16 a warp, then the digits' totals
    // In the scratch, a block's 2k keys and 2k indices: its candidates, then stable_sort's other buffer.
    K* candidate_keys = SHARED ? shared_keys : scratch_keys + (long long)blockIdx.x * 2 * k;
    int* candidate_index = SHARED ? shared_index : scratch_index + (long long)blockIdx.x * 2 * k;

    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* in = input + row * n;
        if (cache_keys) {
#pragma unroll 8
            for (int i = threadIdx.x; i < n; i += blockDim.x) row_keys[i] = order_key(in[i]);
            __syncthreads();
        }
        // The key of element i (< n) of the row: cache_keys is the same for every thread of the launch.
        auto key_at = [&](int i) -> K { return cache_keys ? row_keys[i] : order_key(in[i]); };
        // 1. The k-th largest key: prefix holds its digits chosen so far, need how many of the keys
        //    matching them are still to be taken.
        K prefix = 0, mask = 0;
        int need = k;
#pragma unroll 1
        for (int shift = BITS - 8; shift >= 0; shift -= 8) {
            for (int i = threadIdx.x; i < 256; i += blockDim.x) histogram[i] = 0u;
            __syncthreads();
            // A block-wide trip count, so that every lane of a warp reaches __match_any_sync: the lanes of a
            // warp with the same digit add their count once (detector scores share their top digits, and
            // one shared-memory address taking every thread's add would serialize them).
            for (int start = 0; start < n; start += blockDim.x) {
                const int i = start + threadIdx.x;
                unsigned int digit = 256u;  // none: past the row, or not matching the digits chosen so far
                if (i < n) {
                    const K key = key_at(i);
                    if ((key & mask) == prefix) digit = static_cast<unsigned int>((key >> shift) & 255);
                }
                // After the first pass most keys no longer match: a warp with none skips the match.
                if (__any_sync(FULL_MASK, digit < 256u)) {
                    const unsigned int peers = __match_any_sync(FULL_MASK, digit);
                    if (digit < 256u && __ffs(peers) - 1 == static_cast<int>(threadIdx.x % 32))
                        atomicAdd(&histogram[digit], static_cast<unsigned int>(__popc(peers)));
                }
            }
            __syncthreads();
            if (threadIdx.x < 32) choose_digit(histogram, need, prefix, shift, chosen_prefix, chosen_need);
            __syncthreads();
            prefix = chosen_prefix;
            need = chosen_need;
            mask |= static_cast<K>(255) << shift;
        }
        const K threshold = prefix;
        const int greater = k - need;  // keys above the threshold: all taken; then `need` equal to it

        // 2. The candidates in index order: those above the threshold to slots [0, greater), the first
        //    `need` equal to it to [greater, k). Warp w takes the w-th of the row's contiguous chunks (a
        //    multiple of 32 long): it counts its chunk's keys above and equal to the threshold, the counts of
        //    the warps before it give its first slots, and it writes its candidates 32 keys at a time.
        {
            const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
            int begin, end;
            warp_chunk(n, warp, warps, begin, end);
            int my_above = 0, my_equal = 0;
            for (int start = begin; start < end; start += 32) {
                const int i = start + lane;
                K key = 0;
                if (i < end) key = key_at(i);
                my_above += __popc(__ballot_sync(FULL_MASK, i < end && key > threshold));
                my_equal += __popc(__ballot_sync(FULL_MASK, i < end && key == threshold));
            }
            if (lane == 0) {
                warp_counts[warp] = my_above;
                warp_counts[32 + warp] = my_equal;
            }
            __syncthreads();
            int above_base = 0, equal_base = 0;
            for (int w = 0; w < warp; ++w) {
                above_base += warp_counts[w];
                equal_base += warp_counts[32 + w];
            }
            const int above_end = above_base + my_above;  // the warp's candidates above: slots [above_base, above_end)
            const unsigned below = (1u << lane) - 1u;
            // Warp-uniform bounds: the loop stops once the warp's keys above are written and no key equal
            // to the threshold is still wanted.
            for (int start = begin; start < end && (above_base < above_end || equal_base < need); start += 32) {
                const int i = start + lane;
                K key = 0;
                if (i < end) key = key_at(i);
                const bool above = i < end && key > threshold, equal = i < end && key == threshold;
                const unsigned above_bits = __ballot_sync(FULL_MASK, above), equal_bits = __ballot_sync(FULL_MASK, equal);
                int slot = -1;
                if (above) slot = above_base + __popc(above_bits & below);
                else if (equal && equal_base + __popc(equal_bits & below) < need)
                    slot = greater + equal_base + __popc(equal_bits & below);
                if (slot >= 0) {
                    candidate_keys[slot] = key;
                    candidate_index[slot] = i;
                }
                above_base += __popc(above_bits);
                equal_base += __popc(equal_bits);
            }
        }
        __syncthreads();

        // 3. Each candidate at its rank.
        T* out_values = values + row * k;
        long long* out_indices = indices + row * k;
        // Without SHARED, the ones above the threshold sorted (sorted_index: where they end): a slot is a rank.
        // Where sort_shared, they are first copied to the dynamic shared memory (the cached keys are no longer
        // read) and sorted there; else sorted in the scratch.
        const int* sorted_index = candidate_index;
        if (!SHARED && sort_shared) {
            K* sort_keys = row_keys;
            int* sort_index = reinterpret_cast<int*>(sort_keys + 2 * static_cast<long long>(k));
            for (int c = threadIdx.x; c < greater; c += blockDim.x) {
                sort_keys[c] = candidate_keys[c];
                sort_index[c] = candidate_index[c];
            }
            __syncthreads();
            sorted_index = stable_sort<K, BITS>(sort_keys, sort_index, sort_keys + k, sort_index + k, greater,
                                                sort_offsets);
        } else if (!SHARED) {
            sorted_index = stable_sort<K, BITS>(candidate_keys, candidate_index, candidate_keys + k,
                                                candidate_index + k, greater, sort_offsets);
        }
        for (int c = threadIdx.x; c < k; c += blockDim.x) {
            const int index = c < greater ? sorted_index[c] : candidate_index[c];
            int rank = c;  // the keys equal to the threshold: after every larger one, in index order
            if (SHARED && c < greater) {
                const K key = candidate_keys[c];
                rank = 0;
                for (int j = 0; j < greater; ++j) {
                    const K other = candidate_keys[j];
                    rank += (other > key) || (other == key && candidate_index[j] < index);
                }
            }
            out_values[rank] = in[index];
            out_indices[rank] = index;
        }
        __syncthreads();  // the candidates, the histogram and the cached keys are reused by the next row
    }
}

template <typename T>
__global__ void __launch_bounds__(TOP_K_BLOCK) top_k_backward(
        const T* __restrict__ values_grad, const long long* __restrict__ indices, T* __restrict__ input_grad,
        long long rows, int n, int k) {
    using C = compute_t<T>;
    __shared__ long long tile_index[TOP_K_BLOCK];
    __shared__ C tile_grad[TOP_K_BLOCK];
    // A block a chunk of a row (blockDim.x elements, an element a thread), grid-stride over (row, chunk).
    const long long chunks = (static_cast<long long>(n) + blockDim.x - 1) / blockDim.x;
    for (long long work = blockIdx.x; work < rows * chunks; work += gridDim.x) {
        const long long row = work / chunks;
        const T* g = values_grad + row * k;
        const long long* where = indices + row * k;
        T* out = input_grad + row * n;
        const long long i = work % chunks * blockDim.x + threadIdx.x;
        C sum = C(0);
        for (int first = 0; first < k; first += blockDim.x) {  // the row's (index, grad) pairs, a tile at a time
            const int j = first + threadIdx.x;
            if (j < k) {
                tile_index[threadIdx.x] = where[j];
                tile_grad[threadIdx.x] = widen(g[j]);
            }
            __syncthreads();
            const int count = min(static_cast<int>(blockDim.x), k - first);
            for (int t = 0; t < count; ++t)
                if (tile_index[t] == i) sum += tile_grad[t];
            __syncthreads();
        }
        if (i < n) out[i] = narrow<T>(sum);
    }
}

template <typename T>
__global__ void __launch_bounds__(TOP_K_BLOCK) top_k_backward_sorted(
        const T* __restrict__ values_grad, const long long* __restrict__ indices, T* __restrict__ input_grad,
        long long rows, int n, int k) {
    using C = compute_t<T>;
    // The launch's dynamic shared memory: stable_sort's two buffers of k keys (~index, so that its descending
    // order is the indices' ascending one; 0 for an index outside [0, n), last) and of k positions j.
    extern __shared__ __align__(16) unsigned char top_k_dynamic[];
    unsigned int* keys = reinterpret_cast<unsigned int*>(top_k_dynamic);
    int* positions = reinterpret_cast<int*>(keys + 2 * static_cast<long long>(k));
    __shared__ int sort_offsets[16 * 32 + 16];
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* g = values_grad + row * k;
        const long long* where = indices + row * k;
        T* out = input_grad + row * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = narrow<T>(C(0));
        for (int j = threadIdx.x; j < k; j += blockDim.x) {
            const long long i = where[j];
            keys[j] = i >= 0 && i < n ? ~static_cast<unsigned int>(i) : 0u;
            positions[j] = j;
        }
        __syncthreads();  // the zeros written before any sum below; the pairs before the sort reads them
        const int* sorted = stable_sort<unsigned int, 32>(keys, positions, keys + k, positions + k, k, sort_offsets);
        const unsigned int* sorted_keys = sorted == positions ? keys : keys + k;
        for (int p = threadIdx.x; p < k; p += blockDim.x) {
            const unsigned int key = sorted_keys[p];
            if (key == 0u || (p > 0 && sorted_keys[p - 1] == key)) continue;  // skipped, or not a run's first
            C sum = C(0);
            for (int q = p; q < k && sorted_keys[q] == key; ++q) sum += widen(g[sorted[q]]);
            out[~key] = narrow<T>(sum);
        }
        __syncthreads();  // the buffers are reused by the next row
    }
}
