; tilefold's prebuilt row library (the LTO method): compiled to bitcode once per target, then
; linked into generated kernels and inlined by LLVM. Plain loops with reassociable adds, so the
; target's vectorizer picks the vector width when the bitcode is built.

define float @tf_lib_row_sum(ptr noalias nocapture readonly %x, i64 %n) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %done, label %loop

loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %acc = phi float [ 0.0, %entry ], [ %sum, %loop ]
  %p = getelementptr inbounds float, ptr %x, i64 %i
  %v = load float, ptr %p, align 4
  %sum = fadd reassoc nsz float %acc, %v
  %next = add nuw nsw i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done

done:
  %result = phi float [ 0.0, %entry ], [ %sum, %loop ]
  ret float %result
}

define float @tf_lib_dot(ptr noalias nocapture readonly %x, ptr noalias nocapture readonly %y,
                         i64 %n) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %done, label %loop

loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %acc = phi float [ 0.0, %entry ], [ %sum, %loop ]
  %px = getelementptr inbounds float, ptr %x, i64 %i
  %py = getelementptr inbounds float, ptr %y, i64 %i
  %vx = load float, ptr %px, align 4
  %vy = load float, ptr %py, align 4
  %sum = call reassoc nsz float @llvm.fmuladd.f32(float %vx, float %vy, float %acc)
  %next = add nuw nsw i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %done

done:
  %result = phi float [ 0.0, %entry ], [ %sum, %loop ]
  ret float %result
}

declare float @llvm.fmuladd.f32(float, float, float)
