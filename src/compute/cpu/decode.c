/*
 * decode.c - one query position against a key/value cache: the attention of
 * incremental decoding (sampling), where the scores are a vector, not a tile.
 */
#include "config.h"
#include "compute/kernels.h"

#include <cblas.h>
#include <math.h>

void fsdp_cpu_attention_decode(float *out, float *scores, const float *q, const float *kcache,
                               const float *vcache, int n, int NH, int NKV, int hs, int ld)
{
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
    for (int h = 0; h < NH; h++) {
        const float *qh = q + (size_t)h * (size_t)hs;
        const float *k = kcache + (size_t)(h / group) * (size_t)hs;
        const float *v = vcache + (size_t)(h / group) * (size_t)hs;
        /* scores = scale K q over the n cached positions */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n, hs, scale, k, ld, qh, 1, 0.0f, scores, 1);
        float m = scores[0];
        for (int j = 1; j < n; j++) {
            m = scores[j] > m ? scores[j] : m;
        }
        float z = 0.0f;
        for (int j = 0; j < n; j++) {
            scores[j] = expf(scores[j] - m);
            z += scores[j];
        }
        /* out_h = V^T p / z */
        cblas_sgemv(CblasRowMajor, CblasTrans, n, hs, 1.0f / z, v, ld, scores, 1, 0.0f,
                    out + (size_t)h * (size_t)hs, 1);
    }
}
