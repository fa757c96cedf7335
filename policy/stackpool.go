package policy

import (
	"context"
	"runtime"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// stackPool runs evaluations on long-lived goroutines that wait for work deep inside a
// pre-grown stack.
//
// OPA's evaluator recurses deeply. Run on a request's goroutine, whose stack the garbage
// collector shrinks again whenever it is mostly unused, every evaluation paid to grow the stack
// back (runtime.newstack/copystack was 11% of the proxy's CPU under load). A worker parks with
// its padding frames in use, more than a quarter of its stack, so the collector leaves the stack
// as it is.
type stackPool struct {
	jobs    chan *evalJob
	stopped chan struct{}
	free    sync.Pool
}

type evalJob struct {
	ctx  context.Context
	rev  *revision
	val  ast.Value
	done chan Decision
}

const (
	// stackPadFrames × stackFrameBytes is the stack a worker holds while parked: more than the
	// evaluation of a typical policy needs on top of it, measured in the thousands of bytes.
	stackPadFrames  = 96
	stackFrameBytes = 1024
)

// newStackPool starts the workers; they stop when ctx ends, after which evaluations run on
// the caller's goroutine.
func newStackPool(ctx context.Context) *stackPool {
	p := &stackPool{jobs: make(chan *evalJob), stopped: make(chan struct{})}
	p.free.New = func() any { return &evalJob{done: make(chan Decision, 1)} }
	workers := max(4, 2*runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	wg.Add(workers)
	for range workers {
		go func() {
			defer wg.Done()
			p.pad(ctx, stackPadFrames, 0)
		}()
	}
	go func() {
		wg.Wait()
		close(p.stopped)
	}()
	return p
}

// pad recurses stackPadFrames times, each frame holding stackFrameBytes, then serves jobs
// from the bottom. The padding is read and written so that it stays on the stack.
//
//go:noinline
func (p *stackPool) pad(ctx context.Context, n int, carry byte) byte {
	var frame [stackFrameBytes]byte
	frame[n%stackFrameBytes] = carry
	if n > 0 {
		return p.pad(ctx, n-1, frame[(n*7)%stackFrameBytes]+1)
	}
	p.serve(ctx)
	return frame[0]
}

func (p *stackPool) serve(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-p.jobs:
			j.done <- j.rev.decide(j.ctx, j.val)
		}
	}
}

// decide evaluates on a worker, or on the caller's goroutine once the workers have stopped.
func (p *stackPool) decide(ctx context.Context, rev *revision, val ast.Value) Decision {
	j := p.free.Get().(*evalJob)
	j.ctx, j.rev, j.val = ctx, rev, val
	select {
	case p.jobs <- j:
		d := <-j.done
		j.ctx, j.rev, j.val = nil, nil, nil
		p.free.Put(j)
		return d
	case <-p.stopped:
		p.free.Put(j)
		return rev.decide(ctx, val)
	case <-ctx.Done():
		p.free.Put(j)
		d, _ := abandoned(ctx, rev)
		return d
	}
}
