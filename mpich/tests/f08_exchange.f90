! The Fortran 2008 bindings (use mpi_f08) on ch3:rch: a token around the ring of
! ranks, a large exchange between ranks 0 and 1 (1 MiB each way, past the channel's
! ring and onto its large-message path) checked word for word, and an allreduce.
! Prints " No Errors" on rank 0 when every check held. Built by scripts/mpich-tests
! with the MPICH's mpifort; skipped by a build without Fortran (--minimal).
program f08_exchange
    use mpi_f08
    implicit none
    integer, parameter :: n = 131072
    integer :: rank, nranks, next, prev, token, total, errs, i, peer
    double precision, allocatable :: out(:), in(:)
    type(MPI_Status) :: status

    call MPI_Init()
    call MPI_Comm_rank(MPI_COMM_WORLD, rank)
    call MPI_Comm_size(MPI_COMM_WORLD, nranks)
    errs = 0

    ! The token gains one at every rank on its way round.
    next = mod(rank + 1, nranks)
    prev = mod(rank - 1 + nranks, nranks)
    if (rank == 0) then
        token = 1
        call MPI_Send(token, 1, MPI_INTEGER, next, 7, MPI_COMM_WORLD)
        call MPI_Recv(token, 1, MPI_INTEGER, prev, 7, MPI_COMM_WORLD, status)
        if (token /= nranks) errs = errs + 1
        if (status%MPI_SOURCE /= prev .or. status%MPI_TAG /= 7) errs = errs + 1
    else
        call MPI_Recv(token, 1, MPI_INTEGER, prev, 7, MPI_COMM_WORLD, status)
        call MPI_Send(token + 1, 1, MPI_INTEGER, next, 7, MPI_COMM_WORLD)
    end if

    ! 1 MiB each way between ranks 0 and 1, every element checked.
    if (nranks >= 2 .and. rank < 2) then
        allocate(out(n), in(n))
        peer = 1 - rank
        do i = 1, n
            out(i) = dble(rank) * 1.0d6 + dble(i)
        end do
        in = -1.0d0
        call MPI_Sendrecv(out, n, MPI_DOUBLE_PRECISION, peer, 9, &
                          in, n, MPI_DOUBLE_PRECISION, peer, 9, MPI_COMM_WORLD, status)
        do i = 1, n
            if (in(i) /= dble(peer) * 1.0d6 + dble(i)) errs = errs + 1
        end do
        deallocate(out, in)
    end if

    call MPI_Allreduce(rank, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    if (total /= nranks * (nranks - 1) / 2) errs = errs + 1

    call MPI_Allreduce(MPI_IN_PLACE, errs, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
    if (rank == 0) then
        if (errs == 0) then
            print '(a)', ' No Errors'
        else
            print '(a,i0,a)', ' Found ', errs, ' errors'
        end if
    end if
    call MPI_Finalize()
end program f08_exchange
