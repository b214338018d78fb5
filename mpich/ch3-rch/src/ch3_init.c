/*
 * ch3:rch - CH3 channel over rdma-channel: initialisation, VC and PG hooks.
 *
 * rdma-channel runs in the mode where the upper layer owns process management
 * (rch_init_process_group_external): MPICH has already started PMI, so the hello
 * cards travel through MPICH's own PMI client (MPIR_pmi_kvs_put / _get / _barrier)
 * instead of a second PMI conversation on the same socket.
 */

#include "mpidi_ch3_impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The ABI version of the channel interface this channel implements. */
char MPIDI_CH3_ABIVersion[] = "1.1";

/* rdma-channel's keys are per rank; PMI's key space is per job: prefix the rank. */
static int pmi_key(char *out, size_t cap, int rank, const char *key)
{
    int n = snprintf(out, cap, "%s-%d", key, rank);
    return (n < 0 || (size_t) n >= cap) ? -1 : 0;
}

static int ex_publish(void *ctx, const char *key, const void *value, size_t len)
{
    int rank = *(int *) ctx;
    char k[64];
    char *v;
    int rc;

    if (pmi_key(k, sizeof(k), rank, key) != 0 || (int) len >= MPIR_pmi_max_val_size())
        return -1;
    v = MPL_malloc(len + 1, MPL_MEM_STRINGS);
    if (v == NULL)
        return -1;
    memcpy(v, value, len);
    v[len] = '\0';
    rc = MPIR_pmi_kvs_put(k, v);
    MPL_free(v);
    return rc == MPI_SUCCESS ? 0 : -1;
}

static int ex_lookup(void *ctx, int rank, const char *key, void *buf, size_t cap, size_t *len)
{
    char k[64];
    int vmax = MPIR_pmi_max_val_size();
    char *v;
    size_t n;
    int rc;

    (void) ctx;
    if (pmi_key(k, sizeof(k), rank, key) != 0)
        return -1;
    v = MPL_malloc(vmax + 1, MPL_MEM_STRINGS);
    if (v == NULL)
        return -1;
    rc = MPIR_pmi_kvs_get(rank, k, v, vmax + 1);
    if (rc != MPI_SUCCESS) {
        MPL_free(v);
        return -1;
    }
    n = strnlen(v, vmax);
    if (n > cap) {
        MPL_free(v);
        return -1;
    }
    memcpy(buf, v, n);
    *len = n;
    MPL_free(v);
    return 0;
}

static int ex_fence(void *ctx)
{
    (void) ctx;
    return MPIR_pmi_barrier() == MPI_SUCCESS ? 0 : -1;
}

/* True when the user set CH3 variable NAME (without its prefix) in any of the three
 * spellings MPICH reads. */
static int cvar_set_by_user(const char *name)
{
    static const char *const prefixes[] = { "MPIR_CVAR_", "MPICH_", "MPIR_PARAM_" };
    char var[128];
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        snprintf(var, sizeof var, "%s%s", prefixes[i], name);
        if (getenv(var))
            return 1;
    }
    return 0;
}

/* CH3 preallocates and initialises its global RMA pools in MPI_Init, right after
 * this channel's init: 16384 operations and 16384 targets by default, 4.5 MiB
 * touched in every process whether it ever uses RMA or not (more than everything
 * else a rank of a 32-rank all-to-all holds; bench/scale.sh). They are overflow
 * pools behind each window's own (256 of each), and CH3 issues pending operations
 * and tries again when they run out, so ch3:rch starts them at 1024 unless the user
 * chose a size. */
#define RCH_RMA_GLOBAL_POOL 1024
static void smaller_rma_pools(void)
{
    if (!cvar_set_by_user("CH3_RMA_OP_GLOBAL_POOL_SIZE"))
        MPIR_CVAR_CH3_RMA_OP_GLOBAL_POOL_SIZE = RCH_RMA_GLOBAL_POOL;
    if (!cvar_set_by_user("CH3_RMA_TARGET_GLOBAL_POOL_SIZE"))
        MPIR_CVAR_CH3_RMA_TARGET_GLOBAL_POOL_SIZE = RCH_RMA_GLOBAL_POOL;
}

/* The exchange's context: this process's rank (the struct is copied by the library,
 * the context must outlive rch_finalize). */
static int my_rank_for_exchange;

int MPIDI_CH3_Init(int has_parent, MPIDI_PG_t * pg_p, int pg_rank)
{
    int mpi_errno = MPI_SUCCESS;
    int rc;
    rch_exchange ex;

    MPIR_FUNC_ENTER;

    MPIR_ERR_CHKANDJUMP(has_parent, mpi_errno, MPI_ERR_OTHER, "**ch3|rch|nodynamic");

    my_rank_for_exchange = pg_rank;
    ex.ctx = &my_rank_for_exchange;
    ex.publish = ex_publish;
    ex.lookup = ex_lookup;
    ex.fence = ex_fence;
    rc = rch_init_process_group_external(pg_rank, MPIDI_PG_Get_size(pg_p), &ex);
    if (rc != RCH_SUCCESS) {
        mpi_errno = MPIDI_CH3I_Rch_error(rc, "init", -1);
        goto fn_fail;
    }
    rc = rch_init();
    if (rc != RCH_SUCCESS) {
        mpi_errno = MPIDI_CH3I_Rch_error(rc, "init", -1);
        goto fn_fail;
    }

    mpi_errno = MPIDI_CH3I_Progress_init();
    MPIR_ERR_CHECK(mpi_errno);
    smaller_rma_pools();

  fn_exit:
    MPIR_FUNC_EXIT;
    return mpi_errno;
  fn_fail:
    goto fn_exit;
}

int MPIDI_CH3_Finalize(void)
{
    int mpi_errno = MPI_SUCCESS;
    int rc;

    MPIR_FUNC_ENTER;

    mpi_errno = MPIDI_CH3I_Progress_finalize();
    MPIR_ERR_CHECK(mpi_errno);

    /* Collective (a PMI barrier), then every connection is torn down: CH3's close
     * protocol has already drained them. */
    rc = rch_finalize();
    if (rc != RCH_SUCCESS) {
        mpi_errno = MPIDI_CH3I_Rch_error(rc, "finalize", -1);
        goto fn_fail;
    }

  fn_exit:
    MPIR_FUNC_EXIT;
    return mpi_errno;
  fn_fail:
    goto fn_exit;
}

int MPIDI_CH3_InitCompleted(void)
{
    return MPI_SUCCESS;
}

int MPIDI_CH3_PortFnsInit(MPIDI_PortFns * portFns)
{
    MPL_UNREFERENCED_ARG(portFns);
    return MPI_SUCCESS;
}

int MPIDI_CH3_VC_Init(MPIDI_VC_t * vc)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    int mpi_errno = MPI_SUCCESS;

    vcch->sendq_head = NULL;
    vcch->sendq_tail = NULL;
    vcch->lentq_head = NULL;
    vcch->lentq_tail = NULL;
    vcch->state = MPIDI_CH3I_VC_STATE_UNCONNECTED;
    vcch->rvc = NULL;
    vcch->send_lane = NULL;
    vcch->active_next = NULL;
    vcch->in_active_list = 0;
    vcch->staged_next = NULL;
    vcch->in_staged_list = 0;
    vcch->busy_next = NULL;
    vcch->in_busy_list = 0;
    vcch->busy_quiet = 0;
    vcch->recv = MPL_malloc(sizeof(*vcch->recv), MPL_MEM_OTHER);
    MPIR_ERR_CHKANDJUMP(vcch->recv == NULL, mpi_errno, MPI_ERR_OTHER, "**nomem");
    vcch->recv->active = NULL;
    vcch->recv->pos = 0;
    vcch->recv->len = 0;
    vcch->recv->last_data = 0;
    vcch->recv->lent_pending = 0;
    memset(&vcch->recv->lane, 0, sizeof(vcch->recv->lane));
    vcch->recv->burst_misses = 0;
    vcch->recv->burst_skips = 0;
    /* The stage is allocated on the VC's first read (most VCs of a big job never
     * carry traffic). */
    vcch->recv->stage = NULL;
    vcch->recv->discard = NULL;
    vcch->recv->discard_off = 0;

    /* VCs of this job's process group are created before MPIDI_CH3_Init (the
     * connection handles are looked up there, in Progress_init); others cannot
     * exist without dynamic processes. */
  fn_fail:
    return mpi_errno;
}

int MPIDI_CH3_VC_Destroy(MPIDI_VC_t * vc)
{
    if (vc->ch.recv != NULL) {
        MPL_free(vc->ch.recv->stage);
        MPL_free(vc->ch.recv->discard);
    }
    MPL_free(vc->ch.recv);
    vc->ch.recv = NULL;
    return MPI_SUCCESS;
}

int MPIDI_CH3_PG_Init(MPIDI_PG_t * pg)
{
    MPL_UNREFERENCED_ARG(pg);
    return MPI_SUCCESS;
}

int MPIDI_CH3_PG_Destroy(MPIDI_PG_t * pg)
{
    MPL_UNREFERENCED_ARG(pg);
    return MPI_SUCCESS;
}

#ifdef MPL_USE_DBG_LOGGING
const char *MPIDI_CH3_VC_GetStateString(struct MPIDI_VC *vc)
{
    switch (vc->ch.state) {
        case MPIDI_CH3I_VC_STATE_UNCONNECTED:
            return "CH3I_VC_STATE_UNCONNECTED";
        case MPIDI_CH3I_VC_STATE_CONNECTED:
            return "CH3I_VC_STATE_CONNECTED";
        case MPIDI_CH3I_VC_STATE_TERMINATED:
            return "CH3I_VC_STATE_TERMINATED";
        case MPIDI_CH3I_VC_STATE_FAILED:
            return "CH3I_VC_STATE_FAILED";
    }
    return "unknown";
}
#endif

/* Dynamic processes are not supported (MPIDI_CH3_HAS_NO_DYNAMIC_PROCESS): these hooks
 * answer so, with a clear error, if reached. */
int MPIDI_CH3_Connect_to_root(const char *port_name, MPIDI_VC_t ** new_vc)
{
    int mpi_errno = MPI_SUCCESS;
    MPL_UNREFERENCED_ARG(port_name);
    *new_vc = NULL;
    MPIR_ERR_SET(mpi_errno, MPI_ERR_OTHER, "**ch3|rch|nodynamic");
    return mpi_errno;
}

int MPIDI_CH3_Get_business_card(int myRank, char *value, int length)
{
    int mpi_errno = MPI_SUCCESS;
    MPL_UNREFERENCED_ARG(myRank);
    if (length > 0)
        value[0] = '\0';
    MPIR_ERR_SET(mpi_errno, MPI_ERR_OTHER, "**ch3|rch|nodynamic");
    return mpi_errno;
}
