
    template<typename T, typename I> __global__ void
    fill_B_complex(const int  n_row,
                        const I* __restrict__ Ap,
                        const I* __restrict__ Aj,
                        const   T* __restrict__ Ax,
                        const int* __restrict__ col_offset,
                        const int* __restrict__ col_order,
                        const I* __restrict__ Bp,
                        I*       __restrict__ Bj,
                        T*       __restrict__ Bx)
    {
        // 1 block = 1 row
        const int row = blockIdx.x;
        if (row >= n_row) return;

        __shared__ unsigned long long row_ptr;
        if (threadIdx.x == 0)
            row_ptr = static_cast<unsigned long long>(Bp[row]);
        __syncthreads();

        for (I p = Ap[row] +threadIdx.x; p < Ap[row + 1]; p +=blockDim.x)
        {
            I col     = Aj[p];
            int stop  = col_offset[col];
            int start = (col == 0) ? 0 : col_offset[col - 1];
            int cnt   = stop - start;
            if (cnt == 0) continue;

            T v = Ax[p*2];
            T i = Ax[p*2+1];
            unsigned long long my_out = atomicAdd(
                &row_ptr, static_cast<unsigned long long>(cnt));
            for (int k = 0; k < cnt; ++k)
            {
                Bj[my_out + k] = I(col_order[start + k]);
                Bx[(my_out + k)*2] = v;
                Bx[(my_out + k)*2 + 1] = i;
            }
        }
    }
    