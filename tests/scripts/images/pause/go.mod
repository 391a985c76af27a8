module gpuval.local/pause

go 1.21
