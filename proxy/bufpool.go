package proxy

import "sync"

// copyBufferSize is the buffer of every response copy and tunnel direction, io.Copy's size.
const copyBufferSize = 32 << 10

// copyBuffers recycles those buffers. Without it httputil.ReverseProxy allocates one per
// response and a tunnel two: 60% of the proxy's allocated bytes under load, all of it work for
// the garbage collector. It implements httputil.BufferPool.
var copyBuffers bufferPool

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBufferSize)
}

// Put takes back a buffer from Get; other sizes are left to the collector.
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) != copyBufferSize {
		return
	}
	buf = buf[:copyBufferSize]
	b.p.Put(&buf)
}
