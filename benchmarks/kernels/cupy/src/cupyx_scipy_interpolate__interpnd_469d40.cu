
#include <cupy/complex.cuh>

__forceinline__ __device__ int getCurThreadIdx()
{
    const int threadsPerBlock   = blockDim.x;
    const int curThreadIdx    = ( blockIdx.x * threadsPerBlock ) + threadIdx.x;
    return curThreadIdx;
}

__forceinline__ __device__ int getThreadNum()
{
    const int blocksPerGrid     = gridDim.x;
    const int threadsPerBlock   = blockDim.x;
    const int threadNum         = blocksPerGrid * threadsPerBlock;
    return threadNum;
}

__global__ void estimate_gradients_2d(
        double* points, int n_points, double* values, int values_dim,
        long long* vertex_off, int* vertex_neighbors, double tol, double* err,
        double* prev_grad, double* grad) {

    __shared__ double block_err[512];

    int total = n_points * values_dim;

    for (int midx = getCurThreadIdx(); midx < total; midx += getThreadNum()) {

        int idx = midx / values_dim;
        int dim_idx = midx % values_dim;

        block_err[threadIdx.x] = 0;

        double Q[4] = {0.0, 0.0, 0.0, 0.0};
        double s[2] = {0.0, 0.0};
        double r[2];

        for(int n = vertex_off[idx]; n < vertex_off[idx + 1]; n++) {
            int nidx = vertex_neighbors[n];

            double ex = points[2 * nidx] - points[2 * idx];
            double ey = points[2 * nidx + 1] - points[2 * idx + 1];
            double L = sqrt(ex * ex + ey * ey);
            double L3 = L * L * L;

            double f1 = values[dim_idx * n_points + idx];
            double f2 = values[dim_idx * n_points + nidx];

            double df2 = (
                -ex * prev_grad[2 * n_points * dim_idx + 2 * nidx] -
                 ey * prev_grad[2 * n_points * dim_idx + 2 * nidx + 1]);

            Q[0] += 4 * ex * ex / L3;
            Q[1] += 4 * ex * ey / L3;
            Q[3] += 4 * ey * ey / L3;

            s[0] += (6 * (f1 - f2) - 2 * df2) * ex / L3;
            s[1] += (6 * (f1 - f2) - 2 * df2) * ey / L3;
        }

        Q[2] = Q[1];

        double det = Q[0] * Q[3] - Q[1] * Q[2];
        r[0] = (Q[3] * s[0] - Q[1] * s[1]) / det;
        r[1] = (-Q[2] * s[0] + Q[0] * s[1]) / det;

        double change = fmax(
            fabs(prev_grad[2 * n_points * dim_idx + 2 * idx + 0] + r[0]),
            fabs(prev_grad[2 * n_points * dim_idx + 2 * idx + 1] + r[1]));

        grad[2 * n_points * dim_idx + 2 * idx + 0] = -r[0];
        grad[2 * n_points * dim_idx + 2 * idx + 1] = -r[1];

        change /= fmax(1.0, fmax(fabs(r[0]), fabs(r[1])));
        block_err[threadIdx.x] = fmax(block_err[threadIdx.x], change);

        __syncthreads();

        for(int stride = blockDim.x / 2; stride > 0; stride /= 2) {
            if (threadIdx.x < stride) {
                float lhs = block_err[threadIdx.x];
                float rhs = block_err[threadIdx.x + stride];
                block_err[threadIdx.x] = lhs < rhs ? rhs : lhs;
            }
            __syncthreads();
        }

        if(threadIdx.x == 0) {
            err[blockIdx.x] = fmax(err[blockIdx.x], block_err[threadIdx.x]);
        }
    }

}

__device__ void compute_barycentric_coordinates(
        const double* p, const double* p0, const double* p1, const double* p2,
        double* s, double* t) {

    double A = 0.5 * (
        (-p1[1]) * p2[0] + p0[1] * (-p1[0] + p2[0]) +
         p0[0] * (p1[1] - p2[1]) + p1[0] * p2[1]);

    double sign = A < 0 ? -1 : 1;
    double unS = (
        p0[1] * p2[0] - p0[0] * p2[1] +
        (p2[1] - p0[1]) * p[0] +
        (p0[0] - p2[0]) * p[1]) * sign;

    double unT = (
        p0[0] * p1[1] - p0[1] * p1[0] +
        (p0[1] - p1[1]) * p[0] +
        (p1[0] - p0[0]) * p[1]) * sign;

    *s = 1.0 / (2.0 * A) * unS;
    *t = 1.0 / (2.0 * A) * unT;
}

template<typename T>
__device__ T clough_tocher_2d_single(
        const double* points, const double* b, T* f, T* df, const int isimplex,
        const int* simplices, const int* neighbors
) {
    T  c3000, c0300, c0030, c0003, c2100, c2010, c2001, c0210, c0201, c0021;
    T  c1200, c1020, c1002, c0120, c0102, c0012;
    T  c1101, c1011, c0111;
    T f1, f2, f3, df12, df13, df21, df23, df31, df32;
    double g[3];
    double e12x, e12y, e23x, e23y, e31x, e31y;
    T w;
    double minval;
    double b1, b2, b3, b4;
    int itri;
    double c[3];
    double y[2];

    e12x = (+ points[0 + 2 * simplices[3 * isimplex + 1]]
            - points[0 + 2 * simplices[3 * isimplex + 0]]);
    e12y = (+ points[1 + 2 * simplices[3 * isimplex + 1]]
            - points[1 + 2 * simplices[3 * isimplex + 0]]);

    e23x = (+ points[0 + 2 * simplices[3 * isimplex + 2]]
            - points[0 + 2 * simplices[3 * isimplex + 1]]);
    e23y = (+ points[1 + 2 * simplices[3 * isimplex + 2]]
            - points[1 + 2 * simplices[3 * isimplex + 1]]);

    e31x = (+ points[0 + 2 * simplices[3 * isimplex + 0]]
            - points[0 + 2 * simplices[3 * isimplex + 2]]);
    e31y = (+ points[1 + 2 * simplices[3 * isimplex + 0]]
            - points[1 + 2 * simplices[3 * isimplex + 2]]);

    f1 = f[0];
    f2 = f[1];
    f3 = f[2];

    df12 = +(df[2 * 0 + 0] * e12x + df[2 * 0 + 1] * e12y);
    df21 = -(df[2 * 1 + 0] * e12x + df[2 * 1 + 1] * e12y);
    df23 = +(df[2 * 1 + 0] * e23x + df[2 * 1 + 1] * e23y);
    df32 = -(df[2 * 2 + 0] * e23x + df[2 * 2 + 1] * e23y);
    df31 = +(df[2 * 2 + 0] * e31x + df[2 * 2 + 1] * e31y);
    df13 = -(df[2 * 0 + 0] * e31x + df[2 * 0 + 1] * e31y);

    c3000 = f1;
    c2100 = (df12 + 3.0 * c3000) / 3.0;
    c2010 = (df13 + 3.0 * c3000) / 3.0;
    c0300 = f2;
    c1200 = (df21 + 3.0 * c0300) / 3.0;
    c0210 = (df23 + 3.0 * c0300) / 3.0;
    c0030 = f3;
    c1020 = (df31 + 3.0 * c0030) / 3.0;
    c0120 = (df32 + 3.0 * c0030) / 3.0;

    c2001 = (c2100 + c2010 + c3000) / 3.0;
    c0201 = (c1200 + c0300 + c0210) / 3.0;
    c0021 = (c1020 + c0120 + c0030) / 3.0;

    const double* p0 = points + 2 * simplices[3 * isimplex];
    const double* p1 = points + 2 * simplices[3 * isimplex + 1];
    const double* p2 = points + 2 * simplices[3 * isimplex + 2];

    for(int k = 0; k < 3; k++) {
        int tri_opp = neighbors[3 * isimplex + k];
        if(tri_opp == -1) {
            g[k] = -0.5;
            continue;
        }

        itri = tri_opp >> 4;
        y[0] = (+ points[0 + 2 * simplices[3 * itri + 0]]
                + points[0 + 2 * simplices[3 * itri + 1]]
                + points[0 + 2 * simplices[3 * itri + 2]]) / 3;

        y[1] = (+ points[1 + 2 * simplices[3 * itri + 0]]
                + points[1 + 2 * simplices[3 * itri + 1]]
                + points[1 + 2 * simplices[3 * itri + 2]]) / 3;

        compute_barycentric_coordinates(y, p0, p1, p2, &c[1], &c[2]);
        c[0] = 1 - c[1] - c[2];

        if(k == 0) {
            g[k] = (2 * c[2] + c[1] - 1) / (2.0 - 3 * c[2] - 3 * c[1]);
        } else if(k == 1) {
            g[k] = (2 * c[0] + c[2] - 1) / (2 - 3 * c[0] - 3 * c[2]);
        } else {
            g[k] = (2 * c[1] + c[0] - 1) / (2 - 3 * c[1] - 3 * c[0]);
        }
    }

    c0111 = (g[0] * (-c0300 + 3.0 * c0210 - 3.0 * c0120 + c0030)
             + (-c0300 + 2.0 * c0210 - c0120 + c0021 + c0201)) / 2.0;
    c1011 = (g[1] * (-c0030 + 3.0 * c1020 - 3.0 * c2010 + c3000)
             + (-c0030 + 2.0 * c1020 - c2010 + c2001 + c0021)) / 2.0;
    c1101 = (g[2] * (-c3000 + 3.0 * c2100 - 3.0 * c1200 + c0300)
             + (-c3000 + 2.0 * c2100 - c1200 + c2001 + c0201)) / 2.0;

    c1002 = (c1101 + c1011 + c2001) / 3.0;
    c0102 = (c1101 + c0111 + c0201) / 3.0;
    c0012 = (c1011 + c0111 + c0021) / 3.0;

    c0003 = (c1002 + c0102 + c0012) / 3.0;

    minval = b[0];
    for(int k = 0; k < 3; k++) {
        if(b[k] < minval) {
            minval = b[k];
        }
    }

    b1 = b[0] - minval;
    b2 = b[1] - minval;
    b3 = b[2] - minval;
    b4 = 3 * minval;

    w = (b1*b1*b1*c3000 + 3.0*b1*b1*b2*c2100 +
         3.0*b1*b1*b3*c2010 +
         3.0*b1*b1*b4*c2001 + 3.0*b1*b2*b2*c1200 +
         6.0*b1*b2*b4*c1101 + 3.0*b1*b3*b3*c1020 + 6.0*b1*b3*b4*c1011 +
         3.0*b1*b4*b4*c1002 + b2*b2*b2*c0300 +
         3.0*b2*b2*b3*c0210 +
         3.0*b2*b2*b4*c0201 + 3.0*b2*b3*b3*c0120 +
         6.0*b2*b3*b4*c0111 +
         3.0*b2*b4*b4*c0102 + b3*b3*b3*c0030 +
         3.0*b3*b3*b4*c0021 +
         3.0*b3*b4*b4*c0012 + pow(b4, 3.0)*c0003);

    return w;
}

template<typename T>
__global__ void clough_tocher_2d(
        const double* points, int n_points, const int* simplices,
        const int* tri_opp, const int* found_simplices, const double* bary,
        int n_queries, const T* values, int values_sz,
        const T* grad, const T* fill_value, T* out) {

    int total = n_queries * values_sz;
    T f[3];
    T df[3 * 2];

    for (int midx = getCurThreadIdx(); midx < total; midx += getThreadNum()) {
        int idx = midx / values_sz;
        int value_dim = midx % values_sz;

        const int isimplex = found_simplices[idx];
        const int* chosen_simplex = simplices + 3 * isimplex;

        if(isimplex == -1) {
            out[idx * values_sz + value_dim] = fill_value[0];
            return;
        }

        for(int j = 0; j < 3; j++) {
            int vi = chosen_simplex[j];
            f[j] = values[values_sz * vi + value_dim];
            df[2 * j] = grad[2 * values_sz * vi + 2 * value_dim];
            df[2 * j + 1] = grad[2 * values_sz * vi + 2 * value_dim + 1];
        }

        T w = clough_tocher_2d_single(
            points, bary + 3 * idx, f, df, isimplex, simplices, tri_opp);

        out[values_sz * idx + value_dim] = w;
    }
}
