package proxy

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBufferPool(t *testing.T) {
	var p bufferPool
	b := p.Get()
	assert.Len(t, b, copyBufferSize)
	p.Put(b[:10]) // a resliced buffer comes back whole
	assert.Len(t, p.Get(), copyBufferSize)
	p.Put(make([]byte, 100)) // a foreign size is not pooled
	for range 3 {
		assert.Len(t, p.Get(), copyBufferSize)
	}
}
