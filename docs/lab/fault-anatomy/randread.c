// One page at random from 1 GiB (or N MiB) of malloc, timed one access at a time: what a
// file fault costs as the program sees it. Half the pages random hex digits (the pool turns
// them away as incompressible at zstd-fast's level), half words with one random byte in
// eight; each page starts with a stamp every read checks.
//   cc -O2 -o randread randread.c; ./randread MIB READS
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
static uint64_t rng=88172645463325252ULL;
static uint64_t xr(void){rng^=rng<<13;rng^=rng>>7;rng^=rng<<17;return rng;}
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int c,char**v){
  size_t mib=atoi(v[1]); int R=atoi(v[2]);
  size_t n=mib<<20, pages=n/4096;
  unsigned char*p=malloc(n);
  const char*hex="0123456789abcdef";
  for(size_t i=0;i<n;i+=8){uint64_t r=xr(); if((i/4096)&1){for(int k=0;k<8;k++)p[i+k]=hex[(r>>(4*k))&15];} else {memcpy(p+i,"word ok ",8); p[i]=(unsigned char)r;}}
  // per-page checksum stamp at offset 0
  for(size_t pg=0;pg<pages;pg++) *(uint64_t*)(p+pg*4096)=pg*2654435761u;
  double*lat=malloc(sizeof(double)*R); uint64_t bad=0;
  double t0=now();
  for(int i=0;i<R;i++){size_t pg=xr()%pages; double a=now(); uint64_t w=*(volatile uint64_t*)(p+pg*4096); lat[i]=now()-a; if(w!=pg*2654435761u)bad++;}
  double t1=now();
  qsort(lat,R,sizeof(double),cmp);
  double sum=0; for(int i=0;i<R;i++)sum+=lat[i];
  printf("reads %d in %.2f s: mean %.1f p50 %.1f p90 %.1f p99 %.1f us, bad %lu\n",R,(t1-t0)/1e6,sum/R,lat[R/2],lat[R*9/10],lat[R*99/100],bad);
  return bad!=0;
}
